"""Training SPS of ppo_procgen.py, ppg_procgen.py and ppo_atari_lstm.py on this machine.

    python benchmark/procgen_lstm_sps.py --out docs/benchmarks/procgen.md

Each script runs once, one after the other, in a temporary folder with a short budget: the
procgen scripts with their default 256 steps per env but --num-envs 16 (the default 64 would take
minutes per iteration on a CPU), PPG with --n-iteration 2 so that one whole cycle (policy phase and
its auxiliary phase) fits in the budget; the LSTM script with its defaults (8 envs x 128 steps).
Reported: the script's own last ``charts/SPS`` (training loop only) and the end-to-end rate, budget
divided by the wall time of the whole process (start-up, env creation and, for PPG, the auxiliary
phase included).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]

RUNS = [
    ("ppo_procgen.py", ["--num-envs", "16", "--total-timesteps", "8192"]),
    ("ppg_procgen.py", ["--num-envs", "16", "--n-iteration", "2", "--total-timesteps", "8192"]),
    ("ppo_atari_lstm.py", ["--total-timesteps", "4096"]),
]
FULL_RUNS = {
    "ppo_procgen.py": "--env-id starpilot --total-timesteps 25000000",
    "ppg_procgen.py": "--env-id starpilot --total-timesteps 25000000",
    "ppo_atari_lstm.py": "--env-id BreakoutNoFrameskip-v4 --total-timesteps 25000000",
}


def measure(script: str, flags: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(REPO / "cleanrl" / script), *flags, "--checkpoint-frequency", "0"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{script} failed:\n{proc.stderr[-3000:]}")
        acc = EventAccumulator(glob.glob(f"{cwd}/runs/*")[0], size_guidance={"scalars": 0})
        acc.Reload()
        sps = acc.Scalars("charts/SPS")
    total = int(flags[flags.index("--total-timesteps") + 1])
    return {"script": script, "flags": " ".join(flags), "sps": sps[-1].value, "end_to_end": total / wall, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the markdown page here (default: print it)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per run")
    args = parser.parse_args()

    results = [measure(script, flags, args.timeout) for script, flags in RUNS]
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, " + (
        torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    )
    lines = [
        "# PPO and PPG on procgen, PPO-LSTM on Atari: training SPS",
        "",
        f"Measured on {datetime.date.today().isoformat()} on {machine}, by",
        "",
        "    python benchmark/procgen_lstm_sps.py --out docs/benchmarks/procgen.md",
        "",
        "One run of each script, one after the other, with a short budget (flags below; all else at the",
        "defaults, torch using every core). `charts/SPS` is the script's own figure for its training loop;",
        "end to end is the budget divided by the wall time of the whole process (start-up, env creation",
        "and, for PPG, the auxiliary phase included).",
        "",
        "| script | flags | charts/SPS | end-to-end steps/s | wall time |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r['script']}` | `{r['flags']}` | {r['sps']:,.0f} | {r['end_to_end']:,.0f} | {r['wall']:.0f} s |"
        )
    lines += [
        "",
        "## Full runs on a GPU machine (25M steps, 3 seeds)",
        "",
        "The procgen scripts need `pip install -r requirements/requirements-procgen.txt && "
        "pip install --no-deps -r requirements/requirements-procgen-nodeps.txt`; PPG keeps its auxiliary",
        "buffer (32 iterations x 64 envs x 256 steps of 64x64x3 uint8 frames, 6.4 GB) on the GPU.",
        "",
        "```bash",
    ]
    for script, flags in FULL_RUNS.items():
        lines.append(f"for seed in 1 2 3; do python cleanrl/{script} {flags} --seed $seed --save-model; done")
    lines += ["```", ""]
    page = "\n".join(lines)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(page)
    print(page)


if __name__ == "__main__":
    main()
