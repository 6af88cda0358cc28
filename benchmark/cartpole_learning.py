"""Steps and wall time that ppo.py, dqn.py and c51.py need to reach a mean return of 475 on CartPole-v1.

Runs each script once per seed (sequentially, one torch thread each, with the flags of
tests/test_learning.py and tests/test_value_based.py), reads the TensorBoard events, and prints a
markdown table: the first global step at which the mean of the last 20 episodic returns is
>= 475, and the wall-clock seconds from process start to that point.

    python benchmark/cartpole_learning.py --seeds 1 2 3 --out docs/benchmarks/cartpole.md
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

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]
VALUE_BASED = (
    "--total-timesteps 150000 --learning-rate 1e-3 --buffer-size 50000 --batch-size 128 --learning-starts 5000 "
    "--train-frequency 4 --target-network-frequency 500 --exploration-fraction 0.2 --end-e 0.02"
)
FLAGS = {
    "ppo.py": "--total-timesteps 100000 --num-envs 8 --num-steps 32 --num-minibatches 1 --update-epochs 20 "
    "--learning-rate 1e-3 --gamma 0.98 --gae-lambda 0.8 --ent-coef 0.0",
    "dqn.py": VALUE_BASED,
    "c51.py": VALUE_BASED,
}
BUDGET = {"ppo.py": 200_000, "dqn.py": 150_000, "c51.py": 150_000}  # the bars of the learning tests


def run(script: str, seed: int) -> tuple[int | None, float | None, float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        start = time.time()
        cmd = [sys.executable, str(REPO / "cleanrl" / script), *FLAGS[script].split(), "--seed", str(seed)]
        subprocess.run(cmd, cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL)
        total = time.time() - start
        acc = EventAccumulator(glob.glob(f"{tmp}/runs/*")[0], size_guidance={"scalars": 0})
        acc.Reload()
        events = acc.Scalars("charts/episodic_return")
        for i in range(19, len(events)):
            if sum(e.value for e in events[i - 19 : i + 1]) / 20 >= 475:
                return events[i].step, events[i].wall_time - start, total
        return None, None, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", nargs="+", default=list(FLAGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=str, default=None, help="also write the table to this markdown file")
    opts = parser.parse_args()
    rows = [
        "| script | seed | steps to 475 | wall time to 475 (s) | whole run (s) |",
        "|---|---|---|---|---|",
    ]
    for script in opts.scripts:
        steps, times = [], []
        for seed in opts.seeds:
            step, seconds, total = run(script, seed)
            if step:
                rows.append(f"| {script} | {seed} | {step} | {seconds:.1f} | {total:.1f} |")
                steps.append(step)
                times.append(seconds)
            else:
                rows.append(f"| {script} | {seed} | not reached | - | {total:.1f} |")
            print(rows[-1], flush=True)
        if steps:
            median = f"**{int(statistics.median(steps))}** (bar: {BUDGET[script]:,})"
            rows.append(f"| **{script} median** | | {median} | **{statistics.median(times):.1f}** | |")
    table = "\n".join(rows)
    print(table)
    if opts.out:
        machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
        commands = "\n".join(f"python cleanrl/{s} {FLAGS[s]} --seed SEED" for s in opts.scripts)
        Path(opts.out).write_text(
            "# CartPole-v1: steps and wall time to a mean return of 475\n\n"
            f"Measured {time.strftime('%Y-%m-%d')} on {machine}, no GPU, one torch thread, runs one after another.\n\n"
            "Command:\n\n```bash\npython benchmark/cartpole_learning.py --scripts "
            + " ".join(opts.scripts)
            + " --seeds "
            + " ".join(map(str, opts.seeds))
            + f" --out {opts.out}\n```\n\nwhich runs, per seed:\n\n```bash\n{commands}\n```\n\n"
            '"Steps to 475" is the first `global_step` at which the mean of the last 20 episodic returns is >= 475 '
            "(the learning tests allow 200,000 steps for PPO and 150,000 for DQN and C51). Wall time counts from "
            "process start (imports included) to the TensorBoard event of that episode.\n\n" + table + "\n"
        )


if __name__ == "__main__":
    main()
