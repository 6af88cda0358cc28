"""ppo_atari_multigpu.py under torchrun with gloo on CPU: correctness across processes and nodes."""

from __future__ import annotations

import glob
import re
import subprocess
import sys
import time

import pytest

from conftest import (
    REPO,
    check_ok,
    free_port,
    only_run_dir,
    rank_lines,
    read_scalars,
    run_script,
    run_torchrun,
    script_env,
    torchrun_command,
)

SCRIPT = "ppo_atari_multigpu.py"
# 2 processes x 2 envs x 128 steps = 512 steps per iteration; 3 iterations.
SMALL = [
    "--num-envs",
    "4",
    "--num-steps",
    "128",
    "--num-minibatches",
    "4",
    "--update-epochs",
    "2",
    "--total-timesteps",
    "1536",
    "--seed",
    "5",
]


def start_lines(output: str) -> dict[int, dict]:
    starts = {}
    for m in re.finditer(r"rank=(\d+) local_rank=(\d+) world_size=(\d+) .*? env_seeds=(\d+)\.\.(\d+)", output):
        starts[int(m.group(1))] = {
            "local_rank": int(m.group(2)),
            "world_size": int(m.group(3)),
            "seeds": set(range(int(m.group(4)), int(m.group(5)) + 1)),
        }
    return starts


def test_two_processes_train_identically_and_log_all_episodes(workdir):
    proc = run_torchrun(["--standalone", "--nproc_per_node=2"], SCRIPT, [*SMALL, "--track"], workdir)
    check_ok(proc)
    done = rank_lines(proc.stdout)
    assert set(done) == {0, 1}, proc.stdout[-3000:]
    # Bitwise-identical parameters after training, and the same number of optimizer steps.
    assert done[0]["sha"] == done[1]["sha"]
    assert done[0]["updates"] == done[1]["updates"] == 3 * 2 * 4

    scalars = read_scalars(only_run_dir(workdir))
    assert len(scalars["losses/value_loss"]) == 3
    assert scalars["charts/SPS"][-1][0] == 1536  # global_step counts the envs of both processes
    # Every episode of every process reaches rank 0's log; rank 1 did finish some.
    assert done[1]["episodes"] > 0
    assert len(scalars["charts/episodic_return"]) == done[0]["episodes"] + done[1]["episodes"]
    # Only rank 0 tracks: one W&B run.
    assert len(glob.glob(str(workdir / "wandb" / "offline-run-*"))) == 1

    starts = start_lines(proc.stdout)
    assert starts[0]["seeds"].isdisjoint(starts[1]["seeds"])
    assert proc.stdout.count("(gradients: shared memory)") == 2  # one CPU node: the default sums in shared memory


def test_parameters_are_broadcast_not_just_seeded(workdir):
    # Ranks seed torch differently (seed + rank), so equal parameters after one short run
    # can only come from the broadcast of rank 0's initial weights plus averaged gradients.
    flags = [
        "--num-envs",
        "2",
        "--num-steps",
        "16",
        "--num-minibatches",
        "1",
        "--update-epochs",
        "1",
        "--total-timesteps",
        "32",
        "--seed",
        "11",
    ]
    proc = run_torchrun(["--standalone", "--nproc_per_node=2"], SCRIPT, flags, workdir)
    check_ok(proc)
    done = rank_lines(proc.stdout)
    assert done[0]["sha"] == done[1]["sha"] and done[0]["updates"] == 1


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_two_nodes_on_loopback(rendezvous, workdir):
    port = free_port()
    flags = [
        "--num-envs",
        "4",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--total-timesteps",
        "256",
    ]
    procs = []
    for node_rank in (0, 1):
        if rendezvous == "static":
            launcher = [
                "--nnodes=2",
                f"--node_rank={node_rank}",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
            ]
        else:
            launcher = [
                "--nnodes=2",
                "--nproc_per_node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=test-two-nodes",
            ]
            if node_rank == 1:
                time.sleep(1)  # let node 0 host the c10d store
        cwd = workdir / f"node{node_rank}"
        cwd.mkdir()
        procs.append(
            subprocess.Popen(
                torchrun_command(launcher, SCRIPT, flags),
                cwd=cwd,
                env=script_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
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
    both = "\n".join(outputs)
    starts, done = start_lines(both), rank_lines(both)
    assert set(starts) == {0, 1}, "global ranks must be 0 and 1 (not two local rank 0s)"
    assert all(s["local_rank"] == 0 and s["world_size"] == 2 for s in starts.values())
    assert starts[0]["seeds"].isdisjoint(starts[1]["seeds"])
    assert done[0]["sha"] == done[1]["sha"]
    assert "shared memory" not in both  # processes on different nodes sum with gloo's all_reduce
    # Only global rank 0 writes a run folder.
    runs = [sorted((workdir / f"node{n}").glob("runs/*")) for n in (0, 1)]
    assert sum(len(r) for r in runs) == 1


def test_target_kl_early_stop_is_collective(workdir):
    flags = [*SMALL, "--target-kl", "1e-9"]
    proc = run_torchrun(["--standalone", "--nproc_per_node=2"], SCRIPT, flags, workdir, timeout=300)
    check_ok(proc)
    done = rank_lines(proc.stdout)
    # Stopped after the first epoch of every iteration, on both ranks alike.
    assert done[0]["updates"] == done[1]["updates"] == 3 * 1 * 4
    assert done[0]["sha"] == done[1]["sha"]


def test_gradient_averaging_unit(workdir):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(REPO / "tests" / "workers" / "grad_average_worker.py"),
        ],
        cwd=workdir,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    check_ok(proc)
    assert proc.stdout.count("gradients averaged correctly") == 2
    assert proc.stdout.count("shared-memory sums correct") == 2


def test_gradient_averaging_unit_three_processes(workdir):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=3",
            str(REPO / "tests" / "workers" / "grad_average_worker.py"),
        ],
        cwd=workdir,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    check_ok(proc)
    assert proc.stdout.count("shared-memory sums correct") == 3


def test_shared_memory_gradients_train_exactly_as_the_backend(workdir):
    # Two processes on one CPU node sum gradients in shared memory by default; with gloo's
    # all_reduce instead (--grad-allreduce backend) training ends with the same parameters, to the bit.
    flags = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
    flags += ["--total-timesteps", "128", "--seed", "3"]
    shas = {}
    for mode in ("auto", "backend"):
        cwd = workdir / mode
        cwd.mkdir()
        proc = run_torchrun(["--standalone", "--nproc_per_node=2"], SCRIPT, [*flags, "--grad-allreduce", mode], cwd)
        check_ok(proc)
        assert ("(gradients: shared memory)" in proc.stdout) == (mode == "auto"), proc.stdout[-3000:]
        done = rank_lines(proc.stdout)
        assert done[0]["sha"] == done[1]["sha"] and done[0]["updates"] == 2 * 2 * 2
        shas[mode] = done[0]["sha"]
    assert shas["auto"] == shas["backend"]


def test_full_shared_memory_falls_back_to_the_backend(workdir):
    # /dev/shm without room for the gradient rows (Docker's default is 64 MB): with the default
    # --grad-allreduce auto, training goes on with gloo's all_reduce and says so; asked for
    # explicitly, shared memory ends the run with one error line. posix_fallocate fails in every
    # process through a sitecustomize module on PYTHONPATH.
    hook = workdir / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import errno, os\n"
        "def _no_space(fd, offset, length):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "os.posix_fallocate = _no_space\n"
    )
    flags = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
    flags += ["--total-timesteps", "128"]
    outputs = {}
    for mode in ("auto", "shared-memory"):
        cwd = workdir / mode
        cwd.mkdir()
        launch = ["--standalone", "--nproc_per_node=2"]
        outputs[mode] = run_torchrun(launch, SCRIPT, [*flags, "--grad-allreduce", mode], cwd, PYTHONPATH=str(hook))
    proc = outputs["auto"]
    check_ok(proc)
    assert proc.stdout.count("gradients summed with gloo's all_reduce instead") == 1, proc.stdout[-3000:]
    assert "cannot reserve" in proc.stdout and "No space left on device" in proc.stdout
    # The ranks' start lines name the path actually used.
    assert "(gradients: shared memory)" not in proc.stdout and proc.stdout.count("backend=gloo threads=") == 2
    done = rank_lines(proc.stdout)
    assert done[0]["sha"] == done[1]["sha"] and done[0]["updates"] == 2 * 2 * 2
    proc = outputs["shared-memory"]
    assert proc.returncode != 0
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: --grad-allreduce shared-memory: cannot reserve"), errors
    # Stopped before any work: no start line, no run folder.
    assert "local_rank=" not in proc.stdout and not (workdir / "shared-memory" / "runs").exists()


def test_shared_memory_gradients_need_one_node(workdir):
    # Checked before the process group starts: a 2-node launch (global world 2, 1 process here).
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    proc = run_script(SCRIPT, ["--no-cuda", "--grad-allreduce", "shared-memory"], workdir, timeout=120, **env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --grad-allreduce shared-memory needs CPU training (--no-cuda) with all processes on one node; "
        "use --grad-allreduce auto or backend"
    ], proc.stderr
    assert not (workdir / "runs").exists()


BAD = [
    (["--device-ids", "0"], "--device-ids lists 1 ids"),
    (["--backend", "nccl", "--no-cuda"], "nccl needs CUDA"),
    (["--num-envs", "3"], "multiple of the 2 processes"),
    (["--num-envs", "4", "--local-num-envs", "2"], "not both"),
    (["--local-num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "not divisible"),
    (["--total-timesteps", "0"], "positive"),
    (["--env-id", "CartPole-v1"], "not an Atari"),
]


@pytest.mark.parametrize("flags,needle", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_input_under_torchrun(flags, needle, workdir):
    proc = run_torchrun(["--standalone", "--nproc_per_node=2"], SCRIPT, flags, workdir, timeout=120)
    assert proc.returncode != 0
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stdout[-3000:]
    assert not (workdir / "runs").exists()
