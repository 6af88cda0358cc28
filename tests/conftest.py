"""Helpers shared by the tests: run a script the way a user does and read what it produced."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "cleanrl"


def script_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            # Two cores are shared by parallel test workers: one torch thread per process.
            "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "SDL_VIDEODRIVER": "dummy",
            "MUJOCO_GL": "egl",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def run_script(script: str, args: list[str], cwd: Path, timeout: float = 600, **extra_env: str):
    """Run ``cleanrl/<script>`` in ``cwd`` as a subprocess and return the CompletedProcess."""
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        cwd=cwd,
        env=script_env(**extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_module(module: str, args: list[str], cwd: Path, timeout: float = 600, **extra_env: str):
    """Run ``python -m cleanrl_utils.<module> <args>`` in ``cwd`` the way a user does (repository importable)."""
    return subprocess.run(
        [sys.executable, "-m", f"cleanrl_utils.{module}", *args],
        cwd=cwd,
        env=script_env(PYTHONPATH=str(REPO), **extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def torchrun_command(launcher_args: list[str], script: str, args: list[str]) -> list[str]:
    """``torchrun <launcher_args> cleanrl/<script> <args>`` without relying on PATH."""
    return [sys.executable, "-m", "torch.distributed.run", *launcher_args, str(SCRIPTS / script), *args]


def run_torchrun(launcher_args: list[str], script: str, args: list[str], cwd: Path, timeout: float = 600, **extra_env):
    """Run a torchrun launch to completion (stdout and stderr merged, since torchrun interleaves them)."""
    return subprocess.run(
        torchrun_command(launcher_args, script, args),
        cwd=cwd,
        env=script_env(**extra_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_ok(proc: subprocess.CompletedProcess) -> None:
    out, err = proc.stdout or "", proc.stderr or ""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"


def rank_lines(output: str) -> dict[int, dict]:
    """The `rank=R done: updates=U episodes=E param_sha256=H` lines of ppo_atari_multigpu.py, by rank."""
    done = {}
    for m in re.finditer(r"rank=(\d+) done: updates=(\d+) episodes=(\d+) param_sha256=([0-9a-f]{64})", output):
        done[int(m.group(1))] = {"updates": int(m.group(2)), "episodes": int(m.group(3)), "sha": m.group(4)}
    return done


def train_two_ranks(flags: list[str], cwd: Path) -> dict[int, dict]:
    """ppo_atari_multigpu.py under torchrun with 2 local processes; checks that both finished with
    identical parameters and returns their done lines."""
    launcher = ["--nnodes=1", "--nproc_per_node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    proc = run_torchrun(launcher, "ppo_atari_multigpu.py", flags, cwd)
    check_ok(proc)
    done = rank_lines(proc.stdout)
    assert sorted(done) == [0, 1], proc.stdout[-3000:]
    assert done[0]["sha"] == done[1]["sha"]  # identical parameters on both ranks
    return done


def only_run_dir(cwd: Path) -> Path:
    runs = [Path(p) for p in glob.glob(str(cwd / "runs" / "*"))]
    assert len(runs) == 1, f"expected one run folder, found {runs}"
    return runs[0]


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars of a run's TensorBoard event files, as {tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_continuous_log(run_dir: Path, batch: int, total: int) -> None:
    """One value per iteration at every multiple of the batch up to the budget: no gap, no repeat."""
    steps = [s for s, _ in read_scalars(run_dir)["losses/value_loss"]]
    assert steps == list(range(batch, total + 1, batch)), steps


def read_text_tags(run_dir: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return acc.Tags()["tensors"]


def load_script_module(script: str):
    """Import a script as a module (its training code sits under ``if __name__ == "__main__"``)."""
    path = SCRIPTS / script
    spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while building Args
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def checkout_workdir(tmp_path: Path) -> Path:
    """A working directory that looks like the repository root to tools that check `cleanrl/<script>` exists."""
    (tmp_path / "cleanrl").symlink_to(REPO / "cleanrl")
    return tmp_path
