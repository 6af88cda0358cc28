"""Do the throughput options change what is learned? Short Breakout runs with and without them.

    python benchmark/learning_equivalence.py --steps 100000 --seeds 1 2 \\
        --out docs/benchmarks/learning_equivalence.md

Runs ppo_atari.py on BreakoutNoFrameskip-v4 once per seed and per flag set (the plain fp32 loop,
and each option), all with the same seeds, and compares the episodic returns: the mean over the
last --last-n episodes of each run, then mean and spread over seeds per flag set, and the
difference to the plain loop against the seed-to-seed spread of the plain loop. Learning curves
are drawn with cleanrl_utils.plot (one curve per flag set).
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]
FLAG_SETS = {
    "plain": ["--no-channels-last", "--env-groups", "1"],
    "channels_last": ["--channels-last", "--env-groups", "1"],
    "env_groups_2": ["--channels-last", "--env-groups", "2"],
    "bf16": ["--channels-last", "--bf16", "--env-groups", "1"],
    "ale": ["--channels-last", "--env-backend", "ale", "--env-groups", "1"],
    "ale_bf16": ["--channels-last", "--bf16", "--env-backend", "ale", "--env-groups", "1"],
}


def read_returns(folder: Path) -> list[float]:
    acc = EventAccumulator(glob.glob(f"{folder}/runs/*")[0], size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("charts/episodic_return")]


def run(name: str, seed: int, steps: int, work: Path, reuse: bool) -> list[float]:
    folder = work / f"{name}_{seed}"
    if reuse and glob.glob(f"{folder}/runs/*"):
        return read_returns(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cmd = [sys.executable, str(REPO / "cleanrl" / "ppo_atari.py"), "--env-id", "BreakoutNoFrameskip-v4",
           "--seed", str(seed), "--total-timesteps", str(steps), "--exp-name", name, "--no-cuda",
           "--checkpoint-frequency", "0", *FLAG_SETS[name]]  # fmt: skip
    subprocess.run(cmd, cwd=folder, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(REPO)))
    return read_returns(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sets", nargs="+", default=list(FLAG_SETS), choices=list(FLAG_SETS))
    parser.add_argument("--last-n", type=int, default=30)
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "learning_equivalence"))
    parser.add_argument("--reuse", action="store_true", help="read runs already in --work-dir instead of re-running")
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    if "plain" not in opts.sets:
        parser.error("--sets must include plain: every other set is compared with it")
    if opts.last_n < 2:
        parser.error("--last-n must be at least 2 (a standard error needs two episodes)")
    work = Path(opts.work_dir)
    finals: dict[str, list[float]] = {name: [] for name in opts.sets}
    errors: dict[str, list[float]] = {name: [] for name in opts.sets}  # standard error of each run's mean
    for seed in opts.seeds:  # seeds outermost: a slow drift of the machine hits every flag set alike
        for name in opts.sets:
            episodes = run(name, seed, opts.steps, work, opts.reuse)
            if len(episodes) < 2:
                sys.exit(f"error: the {name} run of seed {seed} ended {len(episodes)} episode(s) in {opts.steps} "
                         "steps; give more --steps (a standard error needs two)")  # fmt: skip
            returns = episodes[-opts.last_n :]
            finals[name].append(statistics.fmean(returns))
            errors[name].append(statistics.stdev(returns) / len(returns) ** 0.5)
            print(f"{name} seed={seed}: {len(episodes)} episodes, last {len(returns)} mean {finals[name][-1]:.2f}")
    rows = ["| flags | " + " | ".join(f"seed {s}" for s in opts.seeds)
            + " | mean | difference to plain (its standard error) | standard error from the seed spread |",
            "|---|" + "---|" * len(opts.seeds) + "---|---|---|"]  # fmt: skip

    def mean_error(name):  # standard error of the mean over seeds of the per-run means
        return (sum(e**2 for e in errors[name]) ** 0.5) / len(errors[name])

    def seed_error(name):  # standard error of the mean over seeds, from the spread of the per-run means
        return statistics.stdev(finals[name]) / len(finals[name]) ** 0.5 if len(finals[name]) > 1 else float("nan")

    base = statistics.fmean(finals["plain"]) if "plain" in finals else float("nan")
    for name in opts.sets:
        mean = statistics.fmean(finals[name])
        cells = " | ".join(f"{v:.2f} +- {e:.2f}" for v, e in zip(finals[name], errors[name], strict=True))
        diff_error = (mean_error(name) ** 2 + mean_error("plain") ** 2) ** 0.5 if name != "plain" else 0.0
        # The between-seed error: the difference of two seed means, each with the spread of its own seeds.
        seed_diff_error = (seed_error(name) ** 2 + seed_error("plain") ** 2) ** 0.5 if name != "plain" else 0.0
        rows.append(f"| `{' '.join(FLAG_SETS[name])}` ({name}) | {cells} | {mean:.2f} | {mean - base:+.2f} "
                    f"({diff_error:.2f}) | {seed_diff_error:.2f} |")  # fmt: skip
    table = "\n".join(rows)
    print(table)
    if opts.out:
        from cleanrl_utils.plot import plot_runs

        plot_dir = Path(opts.out).with_suffix("")
        plot_runs(str(work), str(plot_dir), window=20, last_n=opts.last_n)
        machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU, Python {platform.python_version()}"
        # The reading written by hand below the table (from "## Reading" on) is kept.
        previous = Path(opts.out).read_text() if Path(opts.out).exists() else ""
        reading = "\n" + previous[previous.index("## Reading") :] if "## Reading" in previous else ""
        Path(opts.out).write_text(
            "# Do the throughput options change what is learned?\n\n"
            f"Measured {time.strftime('%Y-%m-%d')} on {machine}.\n\n"
            f"```bash\npython benchmark/learning_equivalence.py --steps {opts.steps} --seeds "
            f"{' '.join(map(str, opts.seeds))} --sets {' '.join(opts.sets)} --last-n {opts.last_n} --out {opts.out}\n```\n\n"
            f"`ppo_atari.py` on BreakoutNoFrameskip-v4, default hyperparameters, {opts.steps:,} steps per run. "
            f"Each cell is the mean episodic return (whole games, unclipped) of the last {opts.last_n} episodes "
            f"of a run, +- the standard error of that mean (episode returns vary a lot this early). The last "
            "columns are the difference of the seed-averaged means to the plain fp32 loop, with its standard error "
            "from the episodes within each run, and its standard error from the spread of the per-run means between "
            "seeds: a difference within about two standard errors is within noise.\n\n"
            + table
            + f"\n\n![Breakout learning curves]({plot_dir.name}/BreakoutNoFrameskip-v4.png)\n"
            + reading
        )


if __name__ == "__main__":
    main()
