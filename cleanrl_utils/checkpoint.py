"""Checkpoints that survive crashes, preemption and restarts (infrastructure shared by all scripts).

A checkpoint is one ``torch.save``d dict of tensors and plain Python values, so it loads with
``torch.load(weights_only=True)``: a file from elsewhere can not run code when loaded. Files live in
``runs/<run_name>/checkpoints/ckpt_<global_step>.pt``; each is written to a temporary file, flushed,
fsynced and renamed into place (``cleanrl_utils.io.atomic_torch_save``), and the newest ``keep``
are kept. ``--resume auto`` takes the newest file that loads; a truncated or corrupt one is
reported and skipped.

What a script stores (see each script's ``checkpoint_state``): ``script``, ``run_name``, ``args``,
``global_step``, ``iteration``, model and optimizer state dicts, normalisation statistics, and
``rng``: the random-number-generator states of every process (a list indexed by rank).
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import random
import re
import signal
import sys
from typing import Any

import numpy as np
import torch

from cleanrl_utils.io import atomic_torch_save

# Exit status after a requested stop (SIGTERM/SIGINT) once the checkpoint is written: EX_TEMPFAIL
# from sysexits.h, "temporary failure, retry later". Schedulers are told to retry on it.
EXIT_PREEMPTED = 75
# Exit status when the loss or the parameters stop being finite (a real failure: do not retry).
EXIT_NONFINITE = 3

_CKPT = re.compile(r"ckpt_(\d+)\.pt$")


class CheckpointError(Exception):
    """A checkpoint that cannot be used (missing, corrupt, or from another script)."""


def checkpoint_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def list_checkpoints(run_dir: str) -> list[str]:
    """Checkpoint files of a run, oldest first (by global step)."""
    paths = [p for p in glob.glob(os.path.join(checkpoint_dir(run_dir), "ckpt_*.pt")) if _CKPT.search(p)]
    return sorted(paths, key=lambda p: int(_CKPT.search(p).group(1)))


def save_checkpoint(state: dict[str, Any], run_dir: str, keep: int = 3) -> str:
    """Write ``state`` atomically as ``ckpt_<global_step>.pt`` and delete all but the newest ``keep``."""
    path = os.path.join(checkpoint_dir(run_dir), f"ckpt_{int(state['global_step']):012d}.pt")
    atomic_torch_save(state, path)
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            os.remove(old)
    return path


def load_checkpoint(path: str, script: str) -> dict[str, Any]:
    """Load a checkpoint written by ``script`` without unpickling arbitrary objects."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, bad pickle, or a forbidden global: all unusable
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} cannot be loaded safely ({first_line})") from None
    if not isinstance(state, dict) or "global_step" not in state or "script" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this project")
    if state["script"] != script:
        raise CheckpointError(f"{path} was written by {state['script']}.py, not by {script}.py")
    return state


def latest_checkpoint(run_dir: str, script: str) -> dict[str, Any] | None:
    """The newest checkpoint of a run that loads; corrupt ones are reported and skipped."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            state = load_checkpoint(path, script)
        except CheckpointError as e:
            print(f"warning: skipping unusable checkpoint: {e}", file=sys.stderr, flush=True)
            continue
        state["path"] = path
        return state
    return None


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch, cuda) as weights_only-loadable values."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (
            np_state[0],
            # int64, not uint32: uint32 tensors do not survive torch.distributed's object collectives.
            torch.from_numpy(np_state[1].astype(np.int64)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuples(state["python"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(value):
    # random.setstate wants tuples; be tolerant of lists after a round trip.
    if isinstance(value, list | tuple):
        return tuple(_as_tuples(v) for v in value)
    return value


class StopRequest:
    """Turns SIGTERM/SIGINT into a flag the training loop polls, so it can checkpoint and exit.

    A second signal while stopping falls back to the default behaviour (immediate exit).
    """

    def __init__(self, when: str = "after the current step") -> None:
        self.requested = False
        self.signal_name = ""
        self.when = when

    def install(self) -> StopRequest:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        print(f"received {self.signal_name}: stopping {self.when} to write a checkpoint", flush=True)


def find_resume_state(resume: str | None, run_dir: str | None, script: str) -> dict[str, Any] | None:
    """What ``--resume`` asks for: None (fresh run), a checkpoint path, or ``auto``.

    ``auto`` takes the newest usable checkpoint in ``run_dir`` and starts fresh when there is none
    (so the same command serves the first attempt and every retry); it needs a known run folder.
    Raises CheckpointError with a one-line reason when the request cannot be met.
    """
    if resume is None:
        return None
    if resume == "auto":
        if run_dir is None:
            raise CheckpointError("--resume auto needs --run-name (the run folder to resume) outside torchrun")
        return latest_checkpoint(run_dir, script)
    state = load_checkpoint(resume, script)
    state["path"] = resume
    return state


def exit_non_finite(global_step: int, iteration: int, run_dir: str, script: str, quiet: bool = False) -> None:
    """Stop a run whose loss, gradients or parameters are no longer finite; no checkpoint is written,
    so the newest one on disk is the last good state."""
    if not quiet:
        last = latest_checkpoint(run_dir, script)
        print(
            f"error: non-finite loss, gradient or parameters at global_step {global_step} (iteration {iteration}); "
            f"nothing more is saved, the last good checkpoint is {last['path'] if last else 'none (no checkpoint yet)'}",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(EXIT_NONFINITE)


def env_worker_ignores_stop_signals() -> None:
    """Call in an env thunk: move a vector-env subprocess out of the training process's group.

    Ctrl-C, torchrun and schedulers signal the whole process group; the env workers must keep
    stepping until the training process has written its checkpoint and closes them. In a group of
    their own they only get the signals meant for them (the parent's close or terminate), and if
    the parent dies they see their pipe close and exit. In the training process itself (no
    multiprocessing parent) this does nothing.
    """
    if multiprocessing.parent_process() is not None:
        os.setpgid(0, 0)
