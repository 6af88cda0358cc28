"""cleanrl_utils/launch.py: scheduler variables -> torchrun; two real loopback nodes per scheduler."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from cleanrl_utils import launch
from conftest import REPO, SCRIPTS, free_port, rank_lines, script_env

FLAGS = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
FLAGS += ["--total-timesteps", "256"]


def ranks_started(output: str) -> dict[int, int]:
    """{global rank: world size} from the scripts' `rank=R local_rank=L world_size=W ...` lines."""
    return {int(r): int(w) for r, w in re.findall(r"rank=(\d+) local_rank=\d+ world_size=(\d+)", output)}


def checksums(output: str) -> dict[int, str]:
    return {rank: done["sha"] for rank, done in rank_lines(output).items()}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in script_env().items() if not k.startswith(("AWS_BATCH_", "SLURM_", "MASTER_"))}
    env.update(extra)
    return env


def run_two_nodes(tmp_path, node_envs: list[dict[str, str]]) -> list[str]:
    procs = []
    for node, extra in enumerate(node_envs):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        cmd = [sys.executable, "-m", "cleanrl_utils.launch", "--", str(SCRIPTS / "ppo_atari_multigpu.py"), *FLAGS]
        procs.append(
            subprocess.Popen(
                cmd, cwd=cwd, env=clean_env(**extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]
    return outputs


def assert_one_job_of_two_nodes(tmp_path, outputs: list[str], run_id: str) -> None:
    both = "\n".join(outputs)
    assert ranks_started(both) == {0: 2, 1: 2}, both[-3000:]
    sums = checksums(both)
    assert set(sums) == {0, 1} and sums[0] == sums[1]
    # Node 0 (the store's host) runs global rank 0 and alone writes the run, named after the job id.
    assert "rank=0 " in outputs[0] and "rank=1 " in outputs[1]
    runs = sorted((tmp_path / "node0").glob("runs/*"))
    assert [r.name for r in runs] == [f"BreakoutNoFrameskip-v4__ppo_atari_multigpu__1__{run_id}"]
    assert not (tmp_path / "node1" / "runs").exists()


def test_aws_batch_multi_node_variables_make_two_torchrun_nodes(tmp_path):
    port = str(free_port())
    common = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0", "MASTER_PORT": port}
    main = {**common, "AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_ID": "5e3b7a10-job#0"}
    child = {**common, "AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_ID": "5e3b7a10-job#1"}
    child["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "127.0.0.1"
    outputs = run_two_nodes(tmp_path, [main, child])
    assert_one_job_of_two_nodes(tmp_path, outputs, "5e3b7a10-job")


def test_slurm_variables_make_two_torchrun_nodes(tmp_path):
    port = str(free_port())
    common = {"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "127.0.0.1,127.0.0.2", "SLURM_JOB_ID": "4242"}
    nodes = [{**common, "SLURM_NODEID": str(n), "MASTER_PORT": port} for n in (0, 1)]
    outputs = run_two_nodes(tmp_path, nodes)
    assert_one_job_of_two_nodes(tmp_path, outputs, "4242")


def dry(argv: list[str], env: dict[str, str], monkeypatch, gpus: int = 0) -> list[str]:
    monkeypatch.setattr(launch, "visible_gpus", lambda: gpus)
    monkeypatch.chdir(REPO)
    cmd, _ = launch.torchrun_args(argv, env)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    return cmd[3:]


def test_single_node_uses_the_gpus_and_keeps_the_job_id(monkeypatch):
    cmd = dry(["--", "cleanrl/ppo.py", "--env-id", "CartPole-v1"], {"SLURM_NNODES": "1", "SLURM_JOB_ID": "77"}, monkeypatch, gpus=4)  # fmt: skip
    assert cmd == [
        "--nproc-per-node=4", "--max-restarts=3", "--rdzv-id=77", "--nnodes=1", "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0", "cleanrl/ppo.py", "--env-id", "CartPole-v1",
    ]  # fmt: skip
    cmd = dry(["--nproc-per-node", "2", "--max-restarts", "0", "--", "cleanrl/ppo.py"], {}, monkeypatch)
    assert cmd[:2] == ["--nproc-per-node=2", "--max-restarts=0"]
    assert dry(["--", "cleanrl/ppo.py"], {}, monkeypatch)[0] == "--nproc-per-node=1"  # CPU: one process


def test_aws_main_node_becomes_rank_zero_wherever_it_is(monkeypatch):
    env = {"AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "2", "AWS_BATCH_JOB_ID": "j#1"}
    env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "10.0.0.9"
    ranks = {}
    for index in range(3):
        cmd = dry(["--", "cleanrl/ppo.py"], {**env, "AWS_BATCH_JOB_NODE_INDEX": str(index)}, monkeypatch)
        ranks[index] = next(c for c in cmd if c.startswith("--node-rank="))
        addr = next(c for c in cmd if c.startswith("--master-addr="))
        assert addr == ("--master-addr=127.0.0.1" if index == 2 else "--master-addr=10.0.0.9")
        assert "--rdzv-id=j" in cmd and "--master-port=29500" in cmd and "--rdzv-backend=static" in cmd
    assert ranks == {2: "--node-rank=0", 0: "--node-rank=1", 1: "--node-rank=2"}


def test_array_seed_from_the_array_index(monkeypatch):
    cmd = dry(["--array-seed", "10", "--", "cleanrl/ppo.py", "--env-id", "CartPole-v1"], {"AWS_BATCH_JOB_ARRAY_INDEX": "2"}, monkeypatch)  # fmt: skip
    assert cmd[-4:] == ["--env-id", "CartPole-v1", "--seed", "12"]
    cmd = dry(["--array-seed", "1", "--", "cleanrl/ppo.py"], {"SLURM_ARRAY_TASK_ID": "0"}, monkeypatch)
    assert cmd[-2:] == ["--seed", "1"]


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("gpu07", "gpu07"),
        ("gpu[07-09,12],cpu1", "gpu07"),
        ("rack[1-2]-node[003-004]", "rack1-node003"),
        ("a[5],b[1-3]", "a5"),
        ("node-1.cluster,node-2.cluster", "node-1.cluster"),
    ],
)
def test_first_host_of_a_slurm_nodelist(nodelist, first):
    assert launch.first_slurm_host(nodelist) == first


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["cleanrl/ppo.py"], {}, "give the script after `--`"),
        (["--"], {}, "expected a Python script"),
        (["--", "cleanrl/nope.py"], {}, "the script cleanrl/nope.py does not exist"),
        (["--", "cleanrl/ppo.py"], {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1"}, "MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
        (["--", "cleanrl/ppo.py"], {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "x"}, "is not an integer"),
        (["--", "cleanrl/ppo.py"], {"SLURM_NNODES": "2", "SLURM_NODEID": "1"}, "SLURM_JOB_NODELIST is not set"),
        (["--array-seed", "1", "--", "cleanrl/ppo.py"], {}, "--array-seed needs"),
        (["--nproc-per-node", "0", "--", "cleanrl/ppo.py"], {}, "--nproc-per-node must be >= 1"),
    ],
)  # fmt: skip
def test_bad_input_is_one_error_line(argv, env, message):
    proc = subprocess.run(
        [sys.executable, "-m", "cleanrl_utils.launch", *argv],
        cwd=REPO,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr


def test_dockerfile_uses_the_launcher_and_copies_only_what_exists():
    # No Docker engine runs here: check what can be checked without building.
    text = (REPO / "Dockerfile").read_text()
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line and line[0] != "#"}
    assert 'ENTRYPOINT ["python", "-m", "cleanrl_utils.launch"]' in text
    assert {"FROM ${CUDA_IMAGE} AS base-cuda", "FROM ${CPU_IMAGE} AS base-cpu", "FROM base-${BASE}"} <= set(
        text.splitlines()
    )
    assert "ARG BASE=cuda" in text
    for line in text.splitlines():
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            for source in sources:
                assert (REPO / source).exists(), source
                assert source.rstrip("/") not in ignored, f"{source} is excluded by .dockerignore"
    extras = re.search(r'ARG EXTRAS="([^"]*)"', text).group(1).split()
    for extra in extras:
        assert (REPO / "requirements" / f"requirements-{extra}.txt").is_file(), extra
    assert "runs" in ignored and ".git" in ignored


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed")
def test_dockerfile_passes_hadolint():
    proc = subprocess.run(["hadolint", str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
