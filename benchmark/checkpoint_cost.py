"""Checkpoint size and save time of every script at its default settings.

    python benchmark/checkpoint_cost.py --out docs/benchmarks/checkpoints.md

Runs each script for one iteration at its defaults (only the budget is cut to one rollout) with
``--checkpoint-frequency 1``, then re-saves that checkpoint with ``cleanrl_utils.checkpoint``
(temporary file, fsync, rename) several times here and reports the file size and the median save
and load times.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cleanrl_utils.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

REPO = Path(__file__).resolve().parents[1]
# script -> flags that keep its defaults but stop after one iteration
SCRIPTS = {
    "ppo.py": ["--total-timesteps", str(4 * 128)],
    "ppo_atari.py": ["--total-timesteps", str(8 * 128)],
    "ppo_atari_multigpu.py": ["--total-timesteps", str(8 * 128)],
    "ppo_continuous_action.py": ["--total-timesteps", "2048"],
}


def measure(script: str, flags: list[str], repeats: int) -> tuple[int, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, MUJOCO_GL="egl")
        cmd = [
            sys.executable,
            str(REPO / "cleanrl" / script),
            *flags,
            "--run-name",
            "bench",
            "--checkpoint-frequency",
            "1",
        ]
        subprocess.run(cmd, cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run_dir = os.path.join(tmp, "runs", "bench")
        state = latest_checkpoint(run_dir, script[:-3])
        size = os.path.getsize(state.pop("path"))
        saves, loads = [], []
        for i in range(repeats):
            state["global_step"] = 10**9 + i
            t0 = time.perf_counter()
            path = save_checkpoint(state, run_dir, keep=2)
            saves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            load_checkpoint(path, script[:-3])
            loads.append(time.perf_counter() - t0)
        return size, statistics.median(saves), statistics.median(loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    rows = ["| script (defaults) | checkpoint size | median save (atomic, fsync) | median load (weights_only) |",
            "|---|---|---|---|"]  # fmt: skip
    for script, flags in SCRIPTS.items():
        size, save, load = measure(script, flags, opts.repeats)
        rows.append(f"| `{script}` | {size / 1e6:.2f} MB | {save * 1000:.0f} ms | {load * 1000:.0f} ms |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    if opts.out:
        machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
        Path(opts.out).write_text(
            "# Checkpoint size and save time\n\n"
            f"Measured {time.strftime('%Y-%m-%d')} on {machine}, local disk.\n\n"
            f"Command:\n\n```bash\npython benchmark/checkpoint_cost.py --out {opts.out}\n```\n\n"
            "Each script ran one iteration at its default settings; its checkpoint (model, Adam state, counters, "
            "RNG states, flags, and for the continuous script the normalisation statistics) was then saved "
            f"{opts.repeats} times with `cleanrl_utils.checkpoint.save_checkpoint` and loaded back.\n\n" + table + "\n"
        )


if __name__ == "__main__":
    main()
