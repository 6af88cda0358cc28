"""The Atari frame buffer (memory, sampling throughput) and dqn_atari.py's training SPS.

    python benchmark/value_based_atari.py --out docs/benchmarks/value_based_atari.md

(a) Fills an AtariFrameBuffer of --capacity transitions (default the scripts' 1,000,000) from
    --num-envs envs with synthetic frames and episode ends, reports its bytes per transition and
    total size, and times batches of 32 sampled from it (median of several timed blocks).
(b) Runs dqn_atari.py (and c51_atari.py) on Breakout with 1 and 4 envs for a short budget with
    training from the start, and reports the steady-state SPS from its TensorBoard events.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_utils.buffers import AtariFrameBuffer

REPO = Path(__file__).resolve().parents[1]


def buffer_numbers(capacity: int, num_envs: int, blocks: int = 7, batches: int = 200) -> dict:
    rng = np.random.default_rng(0)
    buffer = AtariFrameBuffer(capacity, num_envs)
    frames = rng.integers(0, 255, size=(64, num_envs, 4, 84, 84), dtype=np.uint8)
    actions = np.zeros(num_envs, dtype=np.int64)
    rewards = np.zeros(num_envs, dtype=np.float32)
    steps = capacity // num_envs + 100  # fill the ring and wrap it
    start = time.perf_counter()
    for t in range(steps):
        ends = rng.random(num_envs) < 0.01  # episodes of about 100 steps
        buffer.add(frames[t % 64], actions, rewards, ends & (rng.random(num_envs) < 0.5), ends, frames[(t + 1) % 64])
    fill_s = time.perf_counter() - start
    per_block = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(batches):
            buffer.sample(32, rng)
        per_block.append(batches / (time.perf_counter() - t0))
    return {
        "capacity": buffer.capacity,
        "bytes_per_transition": buffer.bytes_per_transition,
        "gib": buffer.nbytes / 2**30,
        "fill_steps_per_s": steps * num_envs / fill_s,
        "batches_per_s": statistics.median(per_block),
    }


def training_sps(script: str, num_envs: int, total: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        flags = ["--num-envs", str(num_envs), "--total-timesteps", str(total), "--learning-starts", "1000",
                 "--buffer-size", "100000", "--checkpoint-frequency", "0", "--no-cuda"]  # fmt: skip
        subprocess.run([sys.executable, str(REPO / "cleanrl" / script), *flags], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        acc = EventAccumulator(glob.glob(f"{tmp}/runs/*")[0], size_guidance={"scalars": 0})
        acc.Reload()
        events = acc.Scalars("charts/SPS")
        events = events[len(events) // 4 :]  # steady state, after learning started
        return (events[-1].step - events[0].step) / (events[-1].wall_time - events[0].wall_time)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--total-timesteps", type=int, default=6000)
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    b = buffer_numbers(opts.capacity, opts.num_envs)
    rows = [
        "| measurement | value |",
        "|---|---|",
        f"| frame buffer capacity ({opts.num_envs} envs) | {b['capacity']:,} transitions |",
        f"| bytes per transition | {b['bytes_per_transition']:.0f} (limit 7,200) |",
        f"| total size | {b['gib']:.2f} GiB |",
        f"| filling speed (`add`, synthetic frames) | {b['fill_steps_per_s']:,.0f} transitions/s |",
        f"| sampling: batches of 32 per second (median) | {b['batches_per_s']:,.0f} |",
    ]
    print("\n".join(rows), flush=True)
    for script in ("dqn_atari.py", "c51_atari.py"):
        for num_envs in (1, 4):
            sps = training_sps(script, num_envs, opts.total_timesteps)
            rows.append(f"| `{script}` training SPS, {num_envs} env(s), train every 4 steps, batch 32 | {sps:.0f} |")
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    if opts.out:
        machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU, torch {torch.__version__}"
        Path(opts.out).write_text(
            "# Value-based Atari: the frame buffer and training speed\n\n"
            f"Measured {time.strftime('%Y-%m-%d')} on {machine}.\n\n"
            f"Command:\n\n```bash\npython benchmark/value_based_atari.py --out {opts.out}\n```\n\n"
            "The buffer is filled past its capacity (the ring wraps) with synthetic frames and episode ends about "
            "every 100 steps, then sampled. Training runs: `python cleanrl/<script> --num-envs N --total-timesteps "
            f"{opts.total_timesteps} --learning-starts 1000 --buffer-size 100000 --checkpoint-frequency 0 --no-cuda` "
            "on BreakoutNoFrameskip-v4; SPS is the steady state over the last three quarters of the run. On this "
            "CPU-only machine the gradient step (batch 32, Nature CNN) dominates; a GPU removes most of it.\n\n"
            + table
            + "\n"
        )


if __name__ == "__main__":
    main()
