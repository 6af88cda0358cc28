"""`python -m cleanrl_utils.plot`: learning curves grouped by env and script, a band over seeds, a table."""

from __future__ import annotations

import matplotlib.image
import numpy as np
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils.plot import plot_runs, smooth
from conftest import check_ok, run_module, run_script


def fake_run(root, name, env_id, exp_name, seed, values):
    writer = SummaryWriter(str(root / name))
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n|exp_name|{exp_name}|\n|seed|{seed}|\n|env_id|{env_id}|")
    for step, value in enumerate(values):
        writer.add_scalar("charts/episodic_return", value, (step + 1) * 100)
    writer.close()


def test_groups_by_env_and_script_with_mean_and_std_over_seeds(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "custom-name-a", "CartPole-v1", "ppo", 1, [1.0] * 20)
    fake_run(runs, "custom-name-b", "CartPole-v1", "ppo", 2, [3.0] * 20)
    fake_run(runs, "nested/c", "CartPole-v1", "dqn", 1, list(range(20)))
    fake_run(runs, "d", "ALE/Pong-v5", "ppo", 1, [-21.0] * 5)
    summary = plot_runs(str(runs), str(tmp_path / "plots"), last_n=10)
    assert sorted(summary["figures"]) == ["ALE/Pong-v5", "CartPole-v1"]
    assert summary["curves"]["CartPole-v1"] == ["dqn (1 seeds)", "ppo (2 seeds)"]
    assert summary["curves"]["ALE/Pong-v5"] == ["ppo (1 seeds)"]
    table = summary["table"]
    assert "| CartPole-v1 | ppo | 2 | 2.00 +- 1.00 |" in table  # seeds at 1 and 3
    assert "| CartPole-v1 | dqn | 1 | 14.50 +- 0.00 |" in table  # mean of 10..19
    image = matplotlib.image.imread(summary["figures"]["CartPole-v1"])
    assert image.ndim == 3 and image.shape[0] > 100
    assert (tmp_path / "plots" / "ALE_Pong-v5.png").exists()
    assert (tmp_path / "plots" / "results.md").read_text().count("\n| ") == 4


def test_moving_average_smoothing():
    np.testing.assert_allclose(smooth(np.array([0.0, 2.0, 4.0, 6.0]), 2), [0.0, 1.0, 3.0, 5.0])
    np.testing.assert_allclose(smooth(np.array([1.0, 2.0]), 1), [1.0, 2.0])


def test_plot_command_on_runs_of_the_scripts(workdir):
    for script, seed in (("ppo.py", 1), ("ppo.py", 2), ("dqn.py", 1)):
        flags = ["--seed", str(seed), "--total-timesteps", "600"]
        flags += ["--num-envs", "2", "--num-steps", "100"] if script == "ppo.py" else ["--learning-starts", "300"]
        check_ok(run_script(script, flags, workdir))
    proc = run_module("plot", ["--runs", "runs", "--out", "plots", "--x", "wall_time", "--smooth", "3"], workdir)
    check_ok(proc)
    assert "plots/CartPole-v1.png: 2 curves (dqn (1 seeds), ppo (2 seeds))" in proc.stdout
    assert "| CartPole-v1 | ppo | 2 |" in proc.stdout and "| CartPole-v1 | dqn | 1 |" in proc.stdout
    assert (workdir / "plots" / "CartPole-v1.png").stat().st_size > 10_000


def test_plot_bad_input(workdir):
    proc = run_module("plot", ["--runs", "nowhere"], workdir, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and "nowhere" in proc.stderr
