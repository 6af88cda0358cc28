"""cleanrl_utils/tuner.py: trials of a tiny ppo.py, a continued study, normalisation, pruning, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest

from cleanrl_utils.tuner import Tuner, read_metric
from conftest import REPO, run_module

TINY = "--num-envs 2 --num-steps 64 --total-timesteps 512"

# A stand-in script that logs a known return: 100 - 100 (x - 0.3)^2 + seed on EnvA, -(x - 0.3)^2 + seed
# on EnvB, after five early values that the last-3 average must skip.
FAKE = """
import argparse, time
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

p = argparse.ArgumentParser()
p.add_argument("--env-id"); p.add_argument("--seed", type=int); p.add_argument("--x", type=float)
p.add_argument("--tag", default="charts/episodic_return")
a = p.parse_args()
score = {"EnvA-v0": 100 - 100 * (a.x - 0.3) ** 2, "EnvB-v0": -((a.x - 0.3) ** 2)}[a.env_id] + a.seed
w = EventFileWriter(f"runs/{a.env_id}__fake__{a.seed}")
for step, value in enumerate([score - 10] * 5 + [score] * 3):
    w.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[Summary.Value(tag=a.tag, simple_value=value)])))
w.close()
"""


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    path = tmp_path / "fake_script.py"
    path.write_text(FAKE)
    return path


def tune(args: list[str], cwd: Path, timeout: float = 600):
    return run_module("tuner", args, cwd, timeout)


def test_two_trials_of_ppo_then_the_same_study_continues(tmp_path):
    (tmp_path / "cleanrl").symlink_to(REPO / "cleanrl")
    args = ["--script", "cleanrl/ppo.py", "--env-ids", "CartPole-v1", "--target-scores", "CartPole-v1=0,500"]
    args += ["--param", "learning-rate=float:1e-4:1e-2:log", "--param", "update-epochs=int:1:2"]
    args += [f"--fixed={TINY}", "--num-seeds", "1", "--study-name", "ppo-test", "--sampler-seed", "3"]
    first = tune([*args, "--num-trials", "2"], tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "study ppo-test: 2 trials (2 complete)" in first.stdout

    study = optuna.load_study(study_name="ppo-test", storage=f"sqlite:///{tmp_path / 'tuner.sqlite'}")
    for trial in study.trials:
        run_root = tmp_path / "tuner_runs" / "ppo-test" / f"trial_{trial.number}" / "CartPole-v1__1"
        # The trial's value is the run's own metric, normalised to the target range.
        assert trial.value == pytest.approx(read_metric(run_root, "charts/episodic_return", 50) / 500)
        command = (run_root / "output.log").read_text().splitlines()[0]
        assert f"--learning-rate {trial.params['learning-rate']!r}" in command
        assert f"--update-epochs {trial.params['update-epochs']}" in command
        assert command.endswith("--env-id CartPole-v1 --seed 1")

    again = tune([*args, "--num-trials", "1"], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "continuing study ppo-test (2 trials so far)" in again.stdout
    assert "study ppo-test: 3 trials (3 complete)" in again.stdout
    assert len(optuna.load_study(study_name="ppo-test", storage=f"sqlite:///{tmp_path / 'tuner.sqlite'}").trials) == 3


def test_scores_are_normalised_per_env_aggregated_and_averaged_over_seeds(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tuner = Tuner(
        script=str(fake),
        params_fn=lambda trial: {"x": trial.suggest_categorical("x", [0.3, 0.8])},
        target_scores={"EnvA-v0": (0, 100), "EnvB-v0": (-1, 0)},
        metric_last_n=3,
        num_seeds=2,
        sampler=optuna.samplers.GridSampler({"x": [0.3, 0.8]}, seed=0),
        pruner=optuna.pruners.NopPruner(),
        study_name="grid",
    )
    study = tuner.tune(num_trials=2)

    def expected(x: float) -> float:
        per_seed = []
        for seed in (1, 2):
            a = (100 - 100 * (x - 0.3) ** 2 + seed) / 100
            b = (-((x - 0.3) ** 2) + seed + 1) / 1
            per_seed.append((a + b) / 2)
        return sum(per_seed) / 2

    assert sorted((t.params["x"], t.value) for t in study.trials) == [
        (0.3, pytest.approx(expected(0.3))),
        (0.8, pytest.approx(expected(0.8))),
    ]
    assert study.best_trial.params == {"x": 0.3}


def test_a_poor_trial_is_pruned_after_its_first_seed(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    xs = iter([0.3, 0.9])
    tuner = Tuner(
        script=str(fake),
        params_fn=lambda trial: {"x": next(xs)},
        target_scores={"EnvA-v0": (0, 100)},
        metric_last_n=3,
        num_seeds=2,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0),
        study_name="prune",
    )
    study = tuner.tune(num_trials=2)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED"]
    runs = sorted(p.name for p in (tmp_path / "tuner_runs" / "prune" / "trial_1").iterdir())
    assert runs == ["EnvA-v0__1"]  # the second seed never ran


def test_a_metric_the_runs_do_not_log_stops_with_one_error_line(fake, tmp_path):
    args = ["--script", str(fake), "--env-ids", "EnvA-v0", "--param", "x=float:0:1", "--num-trials", "2"]
    proc = tune([*args, "--metric", "charts/nope"], tmp_path)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.match(r"error: the metric charts/nope is not in the event files of .*trial_0/EnvA-v0__1 "
                    r"\(scalars there: charts/episodic_return\)$", lines[0]), lines[0]  # fmt: skip


def test_a_failing_run_fails_its_trial_and_is_reported(fake, tmp_path):
    args = ["--script", str(fake), "--env-ids", "NoSuchEnv-v0", "--param", "x=float:0:1", "--num-trials", "1"]
    proc = tune(args, tmp_path)
    assert proc.returncode == 1
    assert "study fake_script-tuning: 1 trials (1 fail)" in proc.stdout
    assert re.search(
        r"trial 0 failed: NoSuchEnv-v0 seed=1 exited 1; log: .*trial_0/NoSuchEnv-v0__1/output.log", proc.stdout
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--script", "cleanrl/nope.py", "--env-ids", "A-v0", "--param", "x=float:0:1"], "cleanrl/nope.py does not exist"),
        (["--script", "cleanrl/ppo.py", "--env-ids", "A-v0", "--param", "x=float:1:0"], "needs LOW < HIGH"),
        (["--script", "cleanrl/ppo.py", "--env-ids", "A-v0", "--param", "x=normal:0:1"], "expected NAME=float"),
        (["--script", "cleanrl/ppo.py", "--env-ids", "A-v0"], "nothing to tune"),
        (["--script", "cleanrl/ppo.py", "--param", "x=int:1:4"], "no env ids"),
        (["--script", "cleanrl/ppo.py", "--env-ids", "A-v0", "B-v0", "--param", "x=int:1:4"], "no target score range for A-v0, B-v0"),
        (["--script", "cleanrl/ppo.py", "--env-ids", "A-v0", "--target-scores", "C-v0=0,1", "--param", "x=int:1:4"], "C-v0, which is not in --env-ids"),
        (["--script", "cleanrl/ppo.py", "--env-ids", "A-v0", "--param", "x=int:1:4", "--metric", ""], "--metric must name"),
        (["--script", "cleanrl/ppo.py", "--env-ids", "A-v0", "--param", "x=int:1:4", "--num-trials", "0"], "--num-trials must be >= 1"),
        (["--script", "cleanrl/ppo.py", "--env-ids", "A-v0", "--param", "seed=int:1:4"], "must not contain --seed or --env-id"),
        (["--script", "cleanrl/ppo.py", "--env-ids", "A-v0", "--param", "x=int:1:4", "--fixed=--x 2"], "--x is both tuned and fixed"),
    ],
)  # fmt: skip
def test_bad_input_is_one_error_line_and_no_study(args, message, tmp_path):
    (tmp_path / "cleanrl").symlink_to(REPO / "cleanrl")
    proc = tune(args, tmp_path, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert not (tmp_path / "tuner.sqlite").exists() and not (tmp_path / "tuner_runs").exists()
