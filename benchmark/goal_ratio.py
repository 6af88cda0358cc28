"""The throughput goals as ratios to the issue's reference loop, measured side by side.

    python benchmark/goal_ratio.py --reps 3 --out docs/benchmarks/goal_ratio.md

The throughput issue states its SPS goal (750 with 2 processes) next to a reference: "a
straightforward fp32 implementation with in-process envs measures about 500 here". A shared machine's
speed drifts, so this runs that reference (benchmark/reference_loop.py) interleaved with the scripts
and reports each one's SPS as a ratio to it; the goal as a ratio is 750 / 500 = 1.5x.

It also repeats the update timings of the platform notes (one PPO minibatch of 256: forward, loss,
backward, Adam; medians), to show how this machine's speed today compares with the day those notes
were measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import gymnasium as gym
import torch
from throughput import load_script, training_sps

GOAL_SPS, REFERENCE_SPS = 750, 500  # the numbers
# label -> (script, processes, flags)
RUNS = {
    "reference": ("reference_loop.py", 1, []),
    "ppo_atari.py, defaults": ("ppo_atari.py", 1, []),
    "ppo_atari_multigpu.py x2, defaults": ("ppo_atari_multigpu.py", 2, []),
    "ppo_atari_multigpu.py x2, `--bf16 --env-backend ale`": (
        "ppo_atari_multigpu.py",
        2,
        ["--bf16", "--env-backend", "ale"],
    ),
}
# The platform notes' table: ms per minibatch of 256 with 2 and with 1 torch thread.
NOTES_MS = {"fp32": (103, 191), "fp32, channels_last": (63, 111), "bf16 autocast, channels_last": (35, 62)}


def reference_sps(iterations: int) -> float:
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("reference_loop.py")), "--iterations",
                          str(iterations)], check=True, capture_output=True, text=True)  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1].split()[1])


def update_ms(variant: str, threads: int, minibatch: int = 256, updates: int = 15) -> float:
    """One PPO minibatch update (the script's ppo_loss, backward, Adam) on a fixed minibatch, median ms."""
    module = load_script("ppo_atari_multigpu")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    agent = module.Agent(types.SimpleNamespace(single_action_space=gym.spaces.Discrete(4)))
    channels_last, bf16 = "channels_last" in variant, variant.startswith("bf16")
    if channels_last:
        agent = agent.to(memory_format=torch.channels_last)
        agent.channels_last = True
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    obs = agent.preprocess(torch.randint(0, 255, (minibatch, 4, 84, 84), dtype=torch.uint8))
    n = minibatch
    rest = (torch.randint(0, 4, (n,)), torch.full((n,), -1.4), torch.randn(n), torch.randn(n), torch.randn(n))
    args = module.Args(bf16=bf16)
    times = []
    for i in range(updates + 3):
        start = time.perf_counter()
        loss = module.ppo_loss(agent, args, obs, *rest)[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i >= 3:
            times.append(time.perf_counter() - start)
    torch.set_num_threads(previous)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=6, help="training iterations of 1024 steps per run")
    parser.add_argument("--out", default=None, help="write the markdown report")
    opts = parser.parse_args()
    if opts.reps < 1 or opts.iterations < 2:
        raise SystemExit("error: --reps must be at least 1 and --iterations at least 2")
    sps = {label: [] for label in RUNS}
    calib = {(v, t): [] for v in NOTES_MS for t in (2, 1)}
    for rep in range(opts.reps):
        for (variant, threads), values in calib.items():
            values.append(update_ms(variant, threads))
        for label, (script, nproc, flags) in RUNS.items():
            if script == "reference_loop.py":
                sps[label].append(reference_sps(opts.iterations))
            else:
                sps[label].append(training_sps(script, nproc, flags, opts.iterations))
            print(f"rep {rep}: {label}: {sps[label][-1]:.0f} SPS", flush=True)

    med = statistics.median
    ref = med(sps["reference"])
    rows = ["| run | training SPS (runs) | ratio to the reference |", "|---|---|---|"]
    for label, values in sps.items():
        runs = ", ".join(f"{v:.0f}" for v in values)
        rows.append(f"| {label} | {med(values):.0f} ({runs}) | {med(values) / ref:.2f} |")
    rows.append(f"| the issue: reference / goal | {REFERENCE_SPS} / {GOAL_SPS} | {GOAL_SPS / REFERENCE_SPS:.2f} |")
    table_sps = "\n".join(rows)
    rows = ["| minibatch update of 256 | threads | platform notes (ms) | today (ms) | today / notes |",
            "|---|---|---|---|---|"]  # fmt: skip
    for (variant, threads), values in calib.items():
        notes = NOTES_MS[variant][0 if threads == 2 else 1]
        rows.append(f"| {variant} | {threads} | {notes} | {med(values):.0f} | {med(values) / notes:.2f} |")
    table_calib = "\n".join(rows)
    print(table_sps + "\n\n" + table_calib)
    if opts.out:
        machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU, torch {torch.__version__}, "
                   f"Python {platform.python_version()}")  # fmt: skip
        command = f"python benchmark/goal_ratio.py --reps {opts.reps} --iterations {opts.iterations} --out {opts.out}"
        analysis = ""
        if Path(opts.out).exists() and "## Reading" in (previous := Path(opts.out).read_text()):
            analysis = "\n" + previous[previous.index("## Reading") :]  # the reading written by hand is kept
        Path(opts.out).write_text(
            "# The throughput goals as ratios to the reference loop\n\n"
            f"Measured {time.strftime('%Y-%m-%d')} on {machine}; medians of {opts.reps} interleaved repetitions.\n\n"
            f"```bash\n{command}\n```\n\n"
            "## Training SPS side by side\n\n"
            "BreakoutNoFrameskip-v4, 8 envs in all, 128 steps, 4 epochs of 4 minibatches (the defaults); steady "
            "state from the end of the first iteration to the end of the last. The reference is "
            "`benchmark/reference_loop.py`: the straightforward fp32 loop with in-process envs that the issue "
            "names as measuring about 500 SPS here.\n\n" + table_sps + "\n\n"
            "## This machine today against the platform notes\n\n"
            "The update timings of the platform notes' table, repeated (the script's ppo_loss on a fixed "
            "minibatch, backward, Adam):\n\n" + table_calib + "\n" + analysis
        )


if __name__ == "__main__":
    main()
