"""Helpers shared by the tests: run a script the way a user does and read what it produced."""

from __future__ import annotations

import glob
import importlib.util
import os
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


def check_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )


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
