"""Training SPS of every PPO script, a record to compare later changes against.

    python benchmark/ppo_sps.py --reps 3 --out docs/benchmarks/ppo_sps.md

Run it on an idle machine, one run at a time (about 13 minutes with --reps 3 on 2 idle cores, estimated
from short runs; the log gives the wall time of every run).

Each run is one script with its default hyperparameters, on the CPU (--no-cuda), in a temporary
folder, with no checkpoints (--checkpoint-frequency 0) and no saved model, for a few iterations
(--total-timesteps = iterations x steps per iteration; 2 to 10 iterations, see SCRIPT_RUNS). The
exceptions, all to keep a run short on a CPU: the procgen scripts step 16 envs instead of 64 (as
benchmark/procgen_lstm_sps.py does); PPG also collects 64 steps per env instead of 256 and runs one
policy iteration per phase (--n-iteration 1 instead of 32), so that the interval between two
iterations holds one whole PPG cycle, a policy iteration and its auxiliary phase, in 1,024 steps.
The auxiliary work per env step (6 epochs over every stored frame, minibatches of 1,024) does not
depend on --n-iteration; the policy phase updates on minibatches of 128 frames instead of 2,048.

Reported per run:
  steady-state SPS: env steps between the first and the last logged ``losses/value_loss`` (one per
      iteration, in every script) over the wall time between them, so start-up and the first
      iteration are left out (as training_sps in benchmark/throughput.py);
  charts/SPS: the script's own last figure (steps since the start of training over the time since).
Runs are repeated --reps times, interleaved (repetition 1 of every run, then repetition 2, ...),
and the tables give the median with the min-max of the repetitions.

The thread section (--threads, on by default) runs ppo_atari_multigpu.py with 1 process and with 2
(torchrun) with --torch-threads 1 and 2 each, to check the default rule of
cleanrl_utils/distributed.py (cores // local processes). OMP_NUM_THREADS and MKL_NUM_THREADS are
removed from the environment of every run, so that "default" is the scripts' own rule.

--quick shrinks every run (short rollouts, 3 iterations) to check that this script works; its
numbers are not a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from cleanrl_utils.distributed import torch_threads_per_process  # noqa: E402

ATARI_ITERATIONS = 3  # ppo_atari.py and ppo_atari_multigpu.py
QUICK_ITERATIONS = 3  # every run under --quick


@dataclass
class Run:
    label: str
    script: str
    steps_per_iteration: int  # env steps of one iteration with these flags (all processes together)
    iterations: int
    flags: list[str] = field(default_factory=list)
    nproc: int = 1  # > 1: launched by torchrun
    quick_flags: list[str] = field(default_factory=list)  # --quick: a shorter rollout...
    quick_steps_per_iteration: int = 0  # ...and the iteration it gives

    def budget(self, quick: bool) -> tuple[list[str], int]:
        """The flags and the --total-timesteps of a run."""
        if quick:
            # Every flag here is a name and a value; a quick one replaces the same flag of self.flags.
            pairs = dict(zip(self.flags[::2], self.flags[1::2], strict=True))
            pairs.update(zip(self.quick_flags[::2], self.quick_flags[1::2], strict=True))
            flags = [word for pair in pairs.items() for word in pair]
            return flags, self.quick_steps_per_iteration * QUICK_ITERATIONS
        return self.flags, self.steps_per_iteration * self.iterations

    def command(self, quick: bool) -> list[str]:
        flags, total = self.budget(quick)
        script_args = [str(REPO / "cleanrl" / self.script), *flags, "--total-timesteps", str(total)]
        script_args += ["--no-cuda", "--checkpoint-frequency", "0"]
        if self.nproc == 1:
            return [sys.executable, *script_args]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.nproc}"]
        return launcher + script_args


def atari_multigpu(nproc: int, threads: int | None = None) -> Run:
    """ppo_atari_multigpu.py with nproc processes, each with its default 8 envs (so 8 * nproc envs in all)."""
    label, flags = f"ppo_atari_multigpu.py x{nproc}", []
    if threads is not None:
        label += f", {threads} thread{'s' if threads > 1 else ''}"
        flags = ["--torch-threads", str(threads)]
    return Run(
        label,
        "ppo_atari_multigpu.py",
        steps_per_iteration=1024 * nproc,
        iterations=ATARI_ITERATIONS,
        flags=flags,
        nproc=nproc,
        quick_flags=["--num-steps", "16"],
        quick_steps_per_iteration=128 * nproc,
    )


SCRIPT_RUNS = [
    Run(
        "ppo.py",
        "ppo.py",
        steps_per_iteration=4 * 128,
        iterations=10,
        quick_flags=["--num-steps", "16"],
        quick_steps_per_iteration=4 * 16,
    ),
    Run(
        "ppo_continuous_action.py",
        "ppo_continuous_action.py",
        steps_per_iteration=2048,
        iterations=4,
        # 32 minibatches of the one env's rollout: 2 samples each (a single one has no advantage std).
        quick_flags=["--num-steps", "64"],
        quick_steps_per_iteration=64,
    ),
    Run(
        "ppo_atari.py",
        "ppo_atari.py",
        steps_per_iteration=8 * 128,
        iterations=ATARI_ITERATIONS,
        quick_flags=["--num-steps", "16"],
        quick_steps_per_iteration=8 * 16,
    ),
    atari_multigpu(1),
    atari_multigpu(2),
    Run(
        "ppo_atari_lstm.py",
        "ppo_atari_lstm.py",
        steps_per_iteration=8 * 128,
        iterations=3,
        quick_flags=["--num-steps", "16"],
        quick_steps_per_iteration=8 * 16,
    ),
    Run(
        "ppo_procgen.py",
        "ppo_procgen.py",
        steps_per_iteration=16 * 256,
        iterations=2,
        flags=["--num-envs", "16"],
        quick_flags=["--num-steps", "16"],
        quick_steps_per_iteration=16 * 16,
    ),
    Run(
        "ppg_procgen.py",
        "ppg_procgen.py",
        steps_per_iteration=16 * 64,
        iterations=2,
        # One phase = one policy iteration of 1,024 steps, then 6 auxiliary epochs over its frames in
        # one minibatch of 1,024 (the default size).
        flags=["--num-envs", "16", "--num-steps", "64", "--n-iteration", "1"],
        # The auxiliary minibatch must divide the frames of a phase.
        quick_flags=["--num-steps", "16", "--aux-minibatch-size", "256"],
        quick_steps_per_iteration=16 * 16,
    ),
]
THREAD_RUNS = [atari_multigpu(nproc, threads) for nproc in (1, 2) for threads in (1, 2)]


@dataclass
class Sample:
    steady_sps: float
    charts_sps: float
    wall: float


def measure(run: Run, quick: bool, timeout: float) -> Sample:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        proc = subprocess.run(run.command(quick), cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{run.label} failed (exit code {proc.returncode}):\n{proc.stderr[-3000:]}")
        acc = EventAccumulator(glob.glob(f"{tmp}/runs/*")[0], size_guidance={"scalars": 0})
        acc.Reload()
        losses = acc.Scalars("losses/value_loss")
        charts_sps = acc.Scalars("charts/SPS")[-1].value
    if len(losses) < 2:
        raise SystemExit(f"{run.label}: {len(losses)} iteration(s) logged, at least 2 are needed")
    first, last = losses[0], losses[-1]
    return Sample((last.step - first.step) / (last.wall_time - first.wall_time), charts_sps, wall)


def spread(values: list[float]) -> str:
    """Median, with the min-max when there is more than one value."""
    text = f"{statistics.median(values):,.0f}"
    if len(values) > 1:
        text += f" ({min(values):,.0f}-{max(values):,.0f})"
    return text


def table(runs: list[Run], samples: dict[str, list[Sample]], quick: bool) -> str:
    lines = [
        "| run | flags | total timesteps | steady-state SPS | charts/SPS | wall time per run (s) |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        rows = samples[run.label]
        flags, total = run.budget(quick)
        lines.append(
            f"| {run.label} | `{' '.join(flags)}` | {total:,} | {spread([s.steady_sps for s in rows])} | "
            f"{spread([s.charts_sps for s in rows])} | {statistics.median([s.wall for s in rows]):.0f} |"
        )
    return "\n".join(lines)


def thread_reading(samples: dict[str, list[Sample]]) -> str:
    """One paragraph: which thread count trains faster with 1 and 2 processes, against the default rule."""
    sentences = []
    for nproc in (1, 2):
        rates = {t: [s.steady_sps for s in samples[atari_multigpu(nproc, t).label]] for t in (1, 2)}
        med = {t: statistics.median(r) for t, r in rates.items()}
        best, other = (1, 2) if med[1] >= med[2] else (2, 1)
        default, reason = torch_threads_per_process(nproc)
        processes = "1 process" if nproc == 1 else f"{nproc} processes (torchrun)"
        text = (
            f"With {processes}, {best} thread{'s' if best > 1 else ''} per process trains at {med[best]:,.0f} SPS "
            f"against {med[other]:,.0f} with {other} ({med[best] / med[other]:.2f}x); the default rule gives "
            f"{default} ({reason})"
        )
        if default not in rates:
            text += ", a count not measured here."
        elif min(rates[best]) <= max(rates[other]):
            text += ", and the repetitions of the two counts overlap: either is as good here."
        elif default == best:
            text += ", the faster count."
        else:
            text += ", the slower count: here the rule picks the wrong one."
        sentences.append(text)
    return " ".join(sentences)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = list(dict.fromkeys(run.script for run in SCRIPT_RUNS))
    parser.add_argument("--reps", type=int, default=3, help="repetitions of every run, interleaved")
    parser.add_argument(
        "--scripts", nargs="+", default=names, choices=names, metavar="SCRIPT", help="the scripts to run (default: all)"
    )
    parser.add_argument(
        "--threads", action=argparse.BooleanOptionalAction, default=True, help="the thread-count section"
    )
    parser.add_argument("--quick", action="store_true", help="tiny budgets, to check this script (not a measurement)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per run")
    parser.add_argument("--out", default=None, help="write the markdown page here (default: print it only)")
    opts = parser.parse_args()

    script_runs = [run for run in SCRIPT_RUNS if run.script in opts.scripts]
    thread_runs = THREAD_RUNS if opts.threads else []
    samples = {run.label: [] for run in script_runs + thread_runs}
    load_before = os.getloadavg()
    started = time.perf_counter()
    for rep in range(opts.reps):
        for run in script_runs + thread_runs:
            sample = measure(run, opts.quick, opts.timeout)
            samples[run.label].append(sample)
            print(
                f"rep {rep + 1}/{opts.reps} {run.label}: {sample.steady_sps:,.0f} SPS steady, "
                f"{sample.charts_sps:,.0f} charts/SPS, {sample.wall:.0f} s",
                flush=True,
            )
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()

    command = shlex.join(["python", *sys.argv])
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, runs on the CPU"
    )
    lines = [
        "# Training SPS of the PPO scripts",
        "",
        f"Measured {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} on {machine}, by",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{opts.reps} repetition(s), interleaved, {elapsed / 60:.1f} minutes in all; load average (1 min) "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after.",
    ]
    if opts.quick:
        lines += ["", "**--quick: tiny budgets to check the benchmark script; not a measurement.**"]
    if load_before[0] >= 0.5:
        lines += [
            "",
            "**The machine was not idle at the start (load average >= 0.5).** With other work on the cores, torch's",
            "intra-op threads wait for each other and runs with more threads than free cores slow down several",
            "times: compare these numbers only with runs on an idle machine.",
        ]
    lines += [
        "",
        "Every run: the script's default hyperparameters plus the flags shown, `--no-cuda --checkpoint-frequency 0`",
        "and a short `--total-timesteps`; no model saved. Steady-state SPS is the env steps between the first and",
        "the last logged `losses/value_loss` (one per iteration) over the wall time between them, so start-up and",
        "the first iteration are left out; charts/SPS is the script's own last figure. Medians of the",
        "repetitions, min-max in brackets. The procgen scripts step 16 envs instead of 64 to keep a run short on a",
        "CPU; PPG also collects 64 steps per env instead of 256 and runs one policy iteration per phase, so that its",
        "steady state holds one whole cycle (a policy iteration of 1,024 steps and its auxiliary phase).",
        "ppo_atari_multigpu.py x2 is `python -m torch.distributed.run --standalone --nproc_per_node=2`, 8 envs per",
        "process (its default), so 16 envs and twice the batch of x1.",
    ]
    if script_runs:
        lines += ["", "## Scripts", "", table(script_runs, samples, opts.quick)]
    if thread_runs:
        rule = ", ".join(f"{torch_threads_per_process(n)[0]} with {n} process{'es' if n > 1 else ''}" for n in (1, 2))
        lines += [
            "",
            "## Torch threads of ppo_atari_multigpu.py",
            "",
            "ppo_atari_multigpu.py with its defaults and the budget of its runs above, plus an explicit",
            "`--torch-threads`. The default rule (cores // local processes, cleanrl_utils/distributed.py)",
            f"gives here: {rule}.",
            "",
            table(thread_runs, samples, opts.quick),
            "",
            thread_reading(samples),
        ]
    page = "\n".join(lines) + "\n"
    if opts.out:
        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.out).write_text(page)
    print(page)


if __name__ == "__main__":
    main()
