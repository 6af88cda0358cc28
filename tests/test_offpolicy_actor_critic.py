"""DDPG, TD3 and SAC (continuous actions) and SAC on Atari: tiny runs, action bounds, checkpoints, learning."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import cleanrl_utils.checkpoint as ckpt
from conftest import SCRIPTS, check_ok, load_script_module, only_run_dir, read_scalars, run_script, script_env

CONTINUOUS = ["ddpg_continuous_action.py", "td3_continuous_action.py", "sac_continuous_action.py"]
TD3_TAGS = ["losses/qf1_values", "losses/qf2_values", "losses/qf1_loss", "losses/qf2_loss", "losses/qf_loss",
            "losses/actor_loss"]  # fmt: skip
TAGS = {
    "ddpg_continuous_action.py": ["losses/qf1_loss", "losses/qf1_values", "losses/actor_loss"],
    "td3_continuous_action.py": TD3_TAGS,
    "sac_continuous_action.py": [*TD3_TAGS, "losses/alpha", "losses/alpha_loss"],
    "sac_atari.py": [*TD3_TAGS, "losses/alpha", "losses/alpha_loss"],
}
# Small networks and batches keep the tiny runs fast; the updates are real all the same.
SMALL = ["--hidden-size", "32", "--batch-size", "32"]
BOUNDS_ENV = "bounds_env:AsymmetricBounds-v0"
ENVS_DIR = str(Path(__file__).parent / "envs")


def spaces_of(env_id):
    env = gym.make(env_id)
    spaces = types.SimpleNamespace(single_observation_space=env.observation_space, single_action_space=env.action_space)
    env.close()
    return spaces


@pytest.mark.parametrize("num_envs", [1, 2])
@pytest.mark.parametrize("env_id", ["Pendulum-v1", "Hopper-v5"])
@pytest.mark.parametrize("script", CONTINUOUS)
def test_tiny_run_with_gradient_steps(script, env_id, num_envs, workdir):
    flags = [*SMALL, "--env-id", env_id, "--learning-starts", "300", "--total-timesteps", "600",
             "--num-envs", str(num_envs), "--save-model", "--eval-episodes", "2"]  # fmt: skip
    proc = run_script(script, flags, workdir)
    check_ok(proc)
    run_dir = only_run_dir(workdir)
    scalars = read_scalars(run_dir)
    # One gradient step per global step past --learning-starts, whatever the number of envs;
    # the losses are logged every 100 gradient steps.
    for tag in TAGS[script]:
        assert [s for s, _ in scalars[tag]] == [400, 500, 600], tag
    assert scalars["charts/episodic_return"]
    assert len(scalars["eval/episodic_return"]) == 2
    saved = torch.load(run_dir / f"{script[:-3]}.cleanrl_model", weights_only=True)
    assert saved["script"] == script[:-3] and saved["env_id"] == env_id
    module = load_script_module(script)
    module.Actor(spaces_of(env_id), hidden_size=32).load_state_dict(saved["model_state_dict"])


@pytest.mark.parametrize("num_envs", [1, 2])
def test_sac_atari_tiny_run(num_envs, workdir):
    flags = ["--learning-starts", "200", "--total-timesteps", "400", "--num-envs", str(num_envs),
             "--buffer-size", "5000", "--save-model", "--eval-episodes", "1"]  # fmt: skip
    proc = run_script("sac_atari.py", flags, workdir)
    check_ok(proc)
    run_dir = only_run_dir(workdir)
    scalars = read_scalars(run_dir)
    for tag in TAGS["sac_atari.py"]:
        assert len(scalars[tag]) == (400 - 200) // 4 // 10, tag  # a gradient step every 4 steps, logged every 10
    assert len(scalars["eval/episodic_return"]) == 1
    saved = torch.load(run_dir / "sac_atari.cleanrl_model", weights_only=True)
    spaces = types.SimpleNamespace(single_action_space=gym.spaces.Discrete(4))
    load_script_module("sac_atari.py").Actor(spaces).load_state_dict(saved["model_state_dict"])


def test_sac_atari_target_entropy_and_soft_target():
    module = load_script_module("sac_atari.py")
    actor = module.Actor(types.SimpleNamespace(single_action_space=gym.spaces.Discrete(4)))
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    actions, log_pi, probs = actor.get_action(obs)
    assert actions.shape == (5,) and log_pi.shape == probs.shape == (5, 4)
    torch.testing.assert_close(probs.sum(1), torch.ones(5))
    torch.testing.assert_close(log_pi.exp(), probs)


@pytest.mark.parametrize("script", CONTINUOUS)
def test_actions_stay_inside_asymmetric_bounds(script, workdir):
    """Every action the env receives (random warm-up, noisy or sampled training actions, evaluation) is in bounds."""
    log = workdir / "actions.txt"
    flags = [*SMALL, "--env-id", BOUNDS_ENV, "--learning-starts", "200", "--total-timesteps", "1000",
             "--num-envs", "2", "--save-model", "--eval-episodes", "2"]  # fmt: skip
    if script != "sac_continuous_action.py":
        flags += ["--exploration-noise", "2.0"]  # noise far past the bounds: the clip must catch it
    proc = run_script(script, flags, workdir, PYTHONPATH=ENVS_DIR, BOUNDS_ENV_LOG=str(log))
    check_ok(proc)  # the env raises on any action outside its bounds
    actions = np.loadtxt(log)
    low, high = np.array([-3.0, 0.5]), np.array([-1.0, 4.0])
    # 1000 global steps less the reset steps after episode ends, then two evaluation episodes of 50
    assert 900 + 100 <= len(actions) <= 1000 + 100
    assert np.all(actions >= low) and np.all(actions <= high)
    # The scaled policy covers the box, not just its centre or one clipped edge.
    trained = actions[250:-100]
    assert np.all(trained.max(0) - trained.min(0) > 0.25 * (high - low)), (trained.min(0), trained.max(0))


@pytest.mark.parametrize("script", CONTINUOUS)
def test_actor_output_is_scaled_onto_the_bounds(script):
    env = gym.make("Pendulum-v1")
    space = gym.spaces.Box(np.array([-3.0, 0.5], np.float32), np.array([-1.0, 4.0], np.float32))
    spaces = types.SimpleNamespace(single_observation_space=env.observation_space, single_action_space=space)
    env.close()
    actor = load_script_module(script).Actor(spaces, hidden_size=8)
    head = actor.fc_mean if script.startswith("sac") else actor.fc_mu
    obs = torch.zeros(1, 3)
    results = []
    for bias in (-1e3, 1e3):
        with torch.no_grad():
            head.weight.zero_()
            head.bias.fill_(bias)
            action = actor.get_action(obs)[2] if script.startswith("sac") else actor(obs)
        results.append(action[0].numpy())
    np.testing.assert_allclose(results[0], space.low, atol=1e-5)
    np.testing.assert_allclose(results[1], space.high, atol=1e-5)


@pytest.mark.parametrize(
    "script,extra",
    [("td3_continuous_action.py", []), ("sac_continuous_action.py", ["--checkpoint-buffer"]),
     ("sac_atari.py", ["--buffer-size", "5000"])],
)  # fmt: skip
def test_sigterm_checkpoint_then_resume(script, extra, workdir):
    atari = script == "sac_atari.py"
    total = 4000 if not atari else 1200
    common = [*([] if atari else SMALL), "--total-timesteps", str(total), "--learning-starts", "200",
              "--run-name", "r", "--checkpoint-frequency", "200" if atari else "100", *extra]  # fmt: skip
    if not atari:
        common += ["--env-id", "Pendulum-v1"]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), *common],
        cwd=workdir, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    ckpt_dir = workdir / "runs" / "r" / "checkpoints"
    deadline = time.time() + 120

    def past_learning_starts():
        newest = ckpt.latest_checkpoint(str(workdir / "runs" / "r"), script[:-3]) if ckpt_dir.exists() else None
        return newest is not None and newest["global_step"] >= 400

    while time.time() < deadline and proc.poll() is None and not past_learning_starts():
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == ckpt.EXIT_PREEMPTED, out[-3000:]
    stopped = ckpt.latest_checkpoint(str(workdir / "runs" / "r"), script[:-3])
    assert 400 <= stopped["global_step"] < total
    assert {"actor", "qf1", "qf2", "qf1_target", "qf2_target", "q_optimizer", "actor_optimizer"} <= set(stopped)
    assert stopped["num_updates"] > 0
    if "--checkpoint-buffer" in extra:
        # Pendulum only truncates, after 200 steps: every step but the reset steps is stored
        assert stopped["replay_buffer"]["size"] == stopped["global_step"] - stopped["global_step"] // 201
    else:
        assert "replay_buffer" not in stopped

    resumed = run_script(script, [*common, "--resume", "auto"], workdir)
    check_ok(resumed)
    assert f"resumed from runs/r/checkpoints/ckpt_{stopped['global_step']:012d}.pt" in resumed.stdout
    assert ckpt.latest_checkpoint(str(workdir / "runs" / "r"), script[:-3])["global_step"] == total
    steps = [s for s, _ in read_scalars(workdir / "runs" / "r")["charts/SPS"]]
    assert steps == sorted(set(steps)), "a step was logged twice"


LEARNING = {
    "td3_continuous_action.py": (20_000, ["--learning-rate", "1e-3"]),
    "sac_continuous_action.py": (20_000, []),
    "ddpg_continuous_action.py": (30_000, ["--learning-rate", "1e-3"]),
}


@pytest.mark.parametrize("script", sorted(LEARNING))
def test_learns_pendulum(script, workdir):
    """A mean return >= -250 over 10 episodes within the budget, and still there at its end."""
    budget, extra = LEARNING[script]
    flags = ["--env-id", "Pendulum-v1", "--total-timesteps", str(budget), "--hidden-size", "64",
             "--batch-size", "128", "--learning-starts", "1000", *extra]  # fmt: skip
    check_ok(run_script(script, flags, workdir, timeout=900))
    returns = [v for _, v in read_scalars(only_run_dir(workdir))["charts/episodic_return"]]
    assert len(returns) == (budget + 1) // 201  # 200-step episodes, each followed by a reset step
    means = [np.mean(returns[i - 10 : i]) for i in range(10, len(returns) + 1)]
    assert max(means) >= -250, f"best mean of 10 episodes {max(means):.1f}"
    assert means[-1] >= -250, f"mean of the last 10 episodes {means[-1]:.1f}"
