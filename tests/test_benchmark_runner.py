"""cleanrl_utils/benchmark.py: a local worker pool over env ids x seeds, and the Slurm array script."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_module

TINY = "python cleanrl/ppo.py --num-envs 2 --num-steps 64 --total-timesteps 512"
TEMPLATE = REPO / "cleanrl_utils" / "templates" / "slurm_array.sbatch"


@pytest.fixture
def workdir(checkout_workdir: Path) -> Path:
    return checkout_workdir


def bench(args: list[str], cwd: Path, timeout: float = 600, **env: str):
    return run_module("benchmark", args, cwd, timeout, **env)


def test_two_envs_two_seeds_two_workers(workdir):
    args = ["--command", TINY, "--env-ids", "CartPole-v1", "Acrobot-v1", "--num-seeds", "2", "--workers", "2"]
    proc = bench([*args, "--log-dir", "logs"], workdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "summary: 4 of 4 runs succeeded, 0 failed" in proc.stdout
    logs = sorted(p.name for p in (workdir / "logs").glob("*.log"))
    assert logs == [f"{e}__ppo__{s}.log" for e in ("Acrobot-v1", "CartPole-v1") for s in (1, 2)]
    runs = sorted(re.sub(r"__\d+$", "", p.name) for p in (workdir / "runs").iterdir())
    assert runs == [f"{e}__ppo__{s}" for e in ("Acrobot-v1", "CartPole-v1") for s in (1, 2)]
    first_line = (workdir / "logs" / "Acrobot-v1__ppo__2.log").read_text().splitlines()[0]
    assert first_line.endswith("cleanrl/ppo.py --num-envs 2 --num-steps 64 --total-timesteps 512 --env-id Acrobot-v1 --seed 2")  # fmt: skip


def test_a_failing_run_is_reported_and_fails_the_benchmark(workdir):
    proc = bench(["--command", TINY, "--env-ids", "CartPole-v1", "NoSuchEnv-v0", "--num-seeds", "1", "--workers", "2",
                  "--log-dir", "logs"], workdir)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "summary: 1 of 2 runs succeeded, 1 failed" in proc.stdout
    failure = proc.stdout.split("summary:")[1]
    assert "failed: NoSuchEnv-v0 seed=1 exit=2 log=logs/NoSuchEnv-v0__ppo__1.log" in failure
    assert "error: unknown or unusable environment id 'NoSuchEnv-v0'" in failure  # the log's last line
    assert "CartPole-v1" not in failure


def render(workdir: Path, extra: list[str]) -> str:
    proc = bench(["--slurm-template", str(TEMPLATE), "--dry-run", *extra], workdir, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def fake_tool(directory: Path, name: str, body: str) -> None:
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_slurm_array_script_runs_each_env_and_seed_with_quoted_flags(workdir):
    args = ["--command", "cleanrl/ppo_atari_multigpu.py --exp-name 'two words' --num-envs 16"]
    args += ["--env-ids", "BreakoutNoFrameskip-v4", "ALE/Pong-v5", "--num-seeds", "2", "--start-seed", "5"]
    args += ["--slurm-nodes", "2", "--slurm-gpus-per-node", "4", "--slurm-partition", "gpu"]
    args += ["--slurm-option=--account=rl", "--log-dir", "slurm_logs"]
    text = render(workdir, args)
    assert "#SBATCH --array=0-3%16" in text and "#SBATCH --nodes=2" in text
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --gpus-per-node=4" in text
    assert "#SBATCH --account=rl" in text and "{{" not in text

    # Run the rendered script as Slurm would, with an srun that prints the arguments it gets.
    script = workdir / "job.sbatch"
    script.write_text(text)
    fake_tool(workdir / "bin", "srun", 'for a in "$@"; do printf "%s\\n" "$a"; done\n')
    env = {**os.environ, "PATH": f"{workdir / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_ID": "99"}
    seen = []
    for task in range(4):
        out = subprocess.run(
            ["bash", str(script)], env={**env, "SLURM_ARRAY_TASK_ID": str(task)}, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        argv = out.stdout.splitlines()[1:]
        launched = argv[argv.index("--") + 1 :]
        assert launched[:5] == ["cleanrl/ppo_atari_multigpu.py", "--exp-name", "two words", "--num-envs", "16"]
        seen.append((launched[-3], launched[-1]))
        assert argv[argv.index("-m") + 1] == "cleanrl_utils.launch"
    assert seen == [("BreakoutNoFrameskip-v4", "5"), ("BreakoutNoFrameskip-v4", "6"), ("ALE/Pong-v5", "5"), ("ALE/Pong-v5", "6")]  # fmt: skip


def test_slurm_submission_calls_sbatch_with_the_rendered_file(workdir):
    fake_tool(workdir / "bin", "sbatch", 'cp "$1" submitted.sbatch; echo "Submitted batch job 123"\n')
    path = f"{workdir / 'bin'}:{os.environ['PATH']}"
    args = ["--slurm-template", str(TEMPLATE), "--command", TINY, "--env-ids", "CartPole-v1", "--log-dir", "sl"]
    proc = bench(args, workdir, timeout=60, PATH=path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Submitted batch job 123 (3 array tasks)")
    assert (workdir / "submitted.sbatch").read_text() == (workdir / "sl" / "slurm_array.sbatch").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--command", "python cleanrl/nope.py", "--env-ids", "CartPole-v1"], "the script cleanrl/nope.py does not exist"),
        (["--command", TINY + " --seed 3", "--env-ids", "CartPole-v1"], "must not contain --seed"),
        (["--command", TINY, "--env-ids", "CartPole-v1", "--dry-run"], "give --slurm-template"),
        (["--command", TINY, "--env-ids", "CartPole-v1", "--workers", "0"], "--workers must be >= 1"),
        (["--command", TINY], "the following arguments are required: --env-ids"),
        (["--command", TINY, "--env-ids", "A-v1", "--slurm-template", "missing.sbatch"], "missing.sbatch does not exist"),
    ],
)  # fmt: skip
def test_bad_input_is_one_error_line(args, message, workdir):
    proc = bench(args, workdir, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert not (workdir / "runs").exists()


def test_a_template_placeholder_the_runner_does_not_know_is_an_error(workdir):
    (workdir / "t.sbatch").write_text(TEMPLATE.read_text() + "echo {{no_such_value}}\n")
    proc = bench(["--slurm-template", "t.sbatch", "--dry-run", "--command", TINY, "--env-ids", "A-v1"], workdir)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: the template uses {{no_such_value}}, which the benchmark does not provide"
    )
