"""Hyperparameter tuning with Optuna: each trial runs a script per env x seed and scores the runs.

    python -m cleanrl_utils.tuner --script cleanrl/ppo.py --env-ids CartPole-v1 Acrobot-v1 \\
        --target-scores CartPole-v1=0,500 Acrobot-v1=-500,0 --num-seeds 2 --num-trials 50 \\
        --param learning-rate=float:3e-5:3e-3:log --param num-minibatches=cat:1,2,4 \\
        --param update-epochs=int:1:8 --fixed="--total-timesteps 100000" --study-name ppo-classic

or from Python::

    from cleanrl_utils.tuner import Tuner
    tuner = Tuner(script="cleanrl/ppo.py", target_scores={"CartPole-v1": (0, 500)},
                  params_fn=lambda trial: {"learning-rate": trial.suggest_float("learning-rate", 3e-5, 3e-3, log=True)})
    study = tuner.tune(num_trials=20)

A run's score is the average of the last ``metric_last_n`` values of ``metric`` (default
``charts/episodic_return``) in its TensorBoard event file, normalised per env to
``(score - low) / (high - low)`` with the env's target range, so envs of different scales can be
aggregated (mean, median, min or max). After each seed the trial reports the mean over the seeds so
far to the pruner, which can stop a poor trial before it spends its remaining seeds. The study lives
in a SQLite file; running again with the same study name adds trials to the same study.
Every run has its own folder ``<workdir>/<study>/trial_<n>/<env>__<seed>/`` holding ``runs/`` and
``output.log``.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cleanrl_utils.cli import Parser, UsageError

AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "mean": statistics.fmean,
    "median": statistics.median,
    "min": min,
    "max": max,
}


class RunFailed(Exception):
    """A run exited non-zero: the trial fails, the study goes on."""


class MetricMissing(Exception):
    """A run finished without logging the metric: every trial would fail the same way, so the study stops."""


def read_metric(run_root: Path, metric: str, last_n: int) -> float:
    """The mean of the last ``last_n`` values of ``metric`` in the one run folder under ``run_root/runs``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = sorted({os.path.dirname(p) for p in glob.glob(str(run_root / "runs" / "**" / "events.out.tfevents.*"), recursive=True)})  # fmt: skip
    if not folders:
        raise MetricMissing(f"the run in {run_root} wrote no TensorBoard event file")
    values: list[tuple[float, int, float]] = []
    tags: set[str] = set()
    for folder in folders:
        acc = EventAccumulator(folder, size_guidance={"scalars": 0})
        acc.Reload()
        tags.update(acc.Tags()["scalars"])
        if metric in acc.Tags()["scalars"]:
            values += [(e.wall_time, e.step, e.value) for e in acc.Scalars(metric)]
    if not values:
        known = ", ".join(sorted(tags)) or "none"
        raise MetricMissing(f"the metric {metric} is not in the event files of {run_root} (scalars there: {known})")
    values.sort()
    return statistics.fmean(v for _, _, v in values[-last_n:])


def as_flags(params: dict[str, Any]) -> list[str]:
    flags = []
    for name, value in params.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):  # tyro's boolean flags: --x / --no-x
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


class Tuner:
    def __init__(
        self,
        script: str,
        params_fn: Callable[[Any], dict[str, Any]],
        target_scores: dict[str, tuple[float, float] | None],
        metric: str = "charts/episodic_return",
        metric_last_n: int = 50,
        direction: str = "maximize",
        aggregation: str = "mean",
        fixed_args: list[str] | None = None,
        num_seeds: int = 1,
        start_seed: int = 1,
        storage: str = "tuner.sqlite",
        study_name: str | None = None,
        pruner: Any = None,
        sampler: Any = None,
        workdir: str = "tuner_runs",
        run_timeout: float | None = None,
    ) -> None:
        if not os.path.isfile(script):
            raise UsageError(f"the script {script} does not exist (working directory {os.getcwd()})")
        if not target_scores:
            raise UsageError("no env ids: give at least one env id (with its target score range)")
        if len(target_scores) > 1 and any(r is None for r in target_scores.values()):
            missing = [e for e, r in target_scores.items() if r is None]
            raise UsageError(f"no target score range for {', '.join(missing)}: scores of several envs need ranges")
        for env_id, bounds in target_scores.items():
            if bounds is not None and not bounds[1] > bounds[0]:
                raise UsageError(f"the target range of {env_id} must have high > low, got {bounds}")
        if not metric:
            raise UsageError("--metric must name a scalar tag such as charts/episodic_return")
        if metric_last_n < 1 or num_seeds < 1:
            raise UsageError("--metric-last-n and --num-seeds must be >= 1")
        if direction not in ("maximize", "minimize"):
            raise UsageError(f"--direction must be maximize or minimize, got {direction}")
        if aggregation not in AGGREGATIONS:
            raise UsageError(f"--aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation}")
        for flag in fixed_args or []:
            if flag.split("=")[0] in ("--env-id", "--seed"):
                raise UsageError(f"the fixed flags must not contain {flag.split('=')[0]}: the tuner sets it per run")
        self.script = os.path.abspath(script)
        self.params_fn = params_fn
        self.target_scores = target_scores
        self.metric, self.metric_last_n = metric, metric_last_n
        self.direction, self.aggregation = direction, aggregation
        self.fixed_args = list(fixed_args or [])
        self.seeds = list(range(start_seed, start_seed + num_seeds))
        self.storage = storage if "://" in storage else f"sqlite:///{os.path.abspath(storage)}"
        self.study_name = study_name or f"{Path(script).stem}-tuning"
        self.pruner, self.sampler = pruner, sampler
        self.workdir = Path(workdir).resolve()
        self.run_timeout = run_timeout

    def run(self, trial_number: int, env_id: str, seed: int, params: dict[str, Any]) -> float:
        root = self.workdir / self.study_name / f"trial_{trial_number}" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', env_id)}__{seed}"  # fmt: skip
        root.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            self.script,
            *self.fixed_args,
            *as_flags(params),
            "--env-id",
            env_id,
            "--seed",
            str(seed),
        ]
        with open(root / "output.log", "w") as log:
            log.write(f"$ {shlex.join(argv)}\n")
            log.flush()
            try:
                code = subprocess.run(argv, cwd=root, stdout=log, stderr=subprocess.STDOUT, timeout=self.run_timeout).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                raise RunFailed(
                    f"{env_id} seed={seed} ran past {self.run_timeout} s; log: {root / 'output.log'}"
                ) from None
        if code != 0:
            raise RunFailed(f"{env_id} seed={seed} exited {code}; log: {root / 'output.log'}")
        return read_metric(root, self.metric, self.metric_last_n)

    def normalise(self, env_id: str, score: float) -> float:
        bounds = self.target_scores[env_id]
        return score if bounds is None else (score - bounds[0]) / (bounds[1] - bounds[0])

    def objective(self, trial) -> float:
        import optuna

        params = self.params_fn(trial)
        per_seed = []
        for step, seed in enumerate(self.seeds):
            normalised = []
            for env_id in self.target_scores:
                try:
                    raw = self.run(trial.number, env_id, seed, params)
                except RunFailed as e:
                    print(f"trial {trial.number} failed: {e}", flush=True)
                    raise
                normalised.append(self.normalise(env_id, raw))
                print(f"trial {trial.number} {env_id} seed={seed}: {self.metric}={raw:.4g} normalised={normalised[-1]:.4g}")  # fmt: skip
            per_seed.append(AGGREGATIONS[self.aggregation](normalised))
            trial.report(statistics.fmean(per_seed), step)
            if trial.should_prune():
                print(f"trial {trial.number} pruned after {step + 1} seed(s)", flush=True)
                raise optuna.TrialPruned()
        score = statistics.fmean(per_seed)
        print(f"trial {trial.number}: score={score:.4g} params={params}", flush=True)
        return score

    def tune(self, num_trials: int) -> Any:
        import optuna

        if num_trials < 1:
            raise UsageError("--num-trials must be >= 1")
        # Our own lines say what happened to each trial; optuna's would repeat them.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        try:
            study = optuna.create_study(
                study_name=self.study_name,
                storage=self.storage,
                load_if_exists=True,
                direction=self.direction,
                pruner=self.pruner,
                sampler=self.sampler,
            )
        except ValueError as e:  # e.g. a stored study with the other direction
            raise UsageError(f"cannot use study {self.study_name} in {self.storage}: {e}") from None
        before = len(study.trials)
        if before:
            print(f"continuing study {self.study_name} ({before} trials so far) in {self.storage}")
        study.optimize(self.objective, n_trials=num_trials, catch=(RunFailed,))
        counts: dict[str, int] = {}
        for t in study.trials:
            counts[t.state.name] = counts.get(t.state.name, 0) + 1
        summary = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
        print(f"study {self.study_name}: {len(study.trials)} trials ({summary}) in {self.storage}")
        completed = [t for t in study.trials if t.state.name == "COMPLETE"]
        if completed:
            best = study.best_trial
            print(f"best trial {best.number}: score={best.value:.4g} flags: {shlex.join(as_flags(best.params))}")
        return study


def parse_param(spec: str) -> tuple[str, Callable[[Any], Any]]:
    """``lr=float:1e-4:1e-2:log`` / ``epochs=int:1:8`` / ``mb=cat:1,2,4`` -> (name, suggest function)."""
    m = re.fullmatch(r"([A-Za-z][A-Za-z0-9_-]*)=(float|int|cat):(.+)", spec)
    if not m:
        raise UsageError(
            f"--param {spec!r}: expected NAME=float:LOW:HIGH[:log], NAME=int:LOW:HIGH[:log] or NAME=cat:A,B"
        )
    name, kind, rest = m.groups()
    if kind == "cat":
        choices = [c for c in rest.split(",") if c]
        if not choices:
            raise UsageError(f"--param {spec!r}: no choices")
        return name, lambda trial: trial.suggest_categorical(name, choices)
    parts = rest.split(":")
    log = parts[-1] == "log"
    if log:
        parts = parts[:-1]
    try:
        low, high = (int(p) if kind == "int" else float(p) for p in parts)
    except ValueError:
        raise UsageError(f"--param {spec!r}: LOW and HIGH must be {kind}s") from None
    if not low < high or (log and low <= 0):
        raise UsageError(f"--param {spec!r}: needs LOW < HIGH (and LOW > 0 with log)")
    if kind == "int":
        return name, lambda trial: trial.suggest_int(name, low, high, log=log)
    return name, lambda trial: trial.suggest_float(name, low, high, log=log)


def parse_targets(env_ids: list[str], specs: list[str]) -> dict[str, tuple[float, float] | None]:
    targets: dict[str, tuple[float, float] | None] = dict.fromkeys(env_ids)
    for spec in specs:
        m = re.fullmatch(r"(.+)=([^,]+),([^,]+)", spec)
        if not m:
            raise UsageError(f"--target-scores {spec!r}: expected ENV=LOW,HIGH")
        if m.group(1) not in targets:
            raise UsageError(f"--target-scores names {m.group(1)}, which is not in --env-ids")
        try:
            low, high = float(m.group(2)), float(m.group(3))
        except ValueError:
            raise UsageError(f"--target-scores {spec!r}: LOW and HIGH must be numbers") from None
        if not (math.isfinite(low) and math.isfinite(high)):
            raise UsageError(f"--target-scores {spec!r}: LOW and HIGH must be finite")
        targets[m.group(1)] = (low, high)
    return targets


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m cleanrl_utils.tuner",
        description="Tune a script's flags with Optuna.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--script", required=True, help="the script to tune, e.g. cleanrl/ppo.py")
    p.add_argument("--env-ids", nargs="+", default=[], help="environment ids")
    p.add_argument("--target-scores", nargs="+", default=[], help="ENV=LOW,HIGH per env id (normalises its score)")
    p.add_argument(
        "--param", action="append", default=[], help="NAME=float:LOW:HIGH[:log] | int:LOW:HIGH[:log] | cat:A,B"
    )
    p.add_argument("--fixed", default="", help="flags every run gets, written --fixed='--total-timesteps 100000'")
    p.add_argument("--metric", default="charts/episodic_return", help="the scalar tag to read")
    p.add_argument("--metric-last-n", type=int, default=50, help="average the last N values of the metric")
    p.add_argument("--direction", default="maximize", help="maximize or minimize")
    p.add_argument("--aggregation", default="mean", help="across envs: " + ", ".join(AGGREGATIONS))
    p.add_argument("--num-seeds", type=int, default=1, help="seeds per trial (the pruner sees each)")
    p.add_argument("--start-seed", type=int, default=1, help="the first seed")
    p.add_argument("--num-trials", type=int, default=20, help="trials to add in this invocation")
    p.add_argument("--study-name", default=None, help="the study (default <script>-tuning); reuse it to continue")
    p.add_argument("--storage", default="tuner.sqlite", help="SQLite file (or a database URL) holding the study")
    p.add_argument("--pruner", default="median", choices=["median", "none"], help="Optuna pruner")
    p.add_argument("--sampler-seed", type=int, default=None, help="seed of the TPE sampler")
    p.add_argument("--workdir", default="tuner_runs", help="where the runs' folders go")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds before a run counts as failed")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if not args.param:
            raise UsageError("nothing to tune: give at least one --param")
        suggesters = [parse_param(spec) for spec in args.param]
        names = [n.replace("_", "-") for n, _ in suggesters]
        if len(set(names)) != len(names):
            raise UsageError(f"a --param is given twice: {names}")
        if set(names) & {"env-id", "seed"}:
            raise UsageError("a --param must not contain --seed or --env-id: the tuner sets them per run")
        if len(set(args.env_ids)) != len(args.env_ids):
            raise UsageError(f"--env-ids lists an id twice: {args.env_ids}")
        try:
            fixed = shlex.split(args.fixed)
        except ValueError as e:
            raise UsageError(f"--fixed cannot be parsed ({e})") from None
        clash = {f.split("=")[0] for f in fixed} & {"--" + n for n in names}
        if clash:
            raise UsageError(f"{', '.join(sorted(clash))} is both tuned and fixed")
        try:
            import optuna
        except ImportError:
            raise UsageError("optuna is not installed: pip install -r requirements/requirements-optuna.txt") from None

        tuner = Tuner(
            script=args.script,
            params_fn=lambda trial: {name: suggest(trial) for name, suggest in suggesters},
            target_scores=parse_targets(args.env_ids, args.target_scores),
            metric=args.metric,
            metric_last_n=args.metric_last_n,
            direction=args.direction,
            aggregation=args.aggregation,
            fixed_args=fixed,
            num_seeds=args.num_seeds,
            start_seed=args.start_seed,
            storage=args.storage,
            study_name=args.study_name,
            pruner=optuna.pruners.MedianPruner() if args.pruner == "median" else optuna.pruners.NopPruner(),
            sampler=optuna.samplers.TPESampler(seed=args.sampler_seed),
            workdir=args.workdir,
            run_timeout=args.run_timeout,
        )
        if args.num_trials < 1:
            raise UsageError("--num-trials must be >= 1")
        study = tuner.tune(args.num_trials)
    except (UsageError, MetricMissing) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    new = study.trials[-args.num_trials :]
    return 0 if any(t.state.name in ("COMPLETE", "PRUNED") for t in new) else 1


if __name__ == "__main__":
    sys.exit(main())
