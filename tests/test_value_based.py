"""DQN and C51 (classic control and Atari): tiny end-to-end runs, the C51 projection, learning."""

from __future__ import annotations

import types

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import check_ok, load_script_module, only_run_dir, read_scalars, run_script

LOSS_TAG = {
    "dqn.py": "losses/td_loss",
    "dqn_atari.py": "losses/td_loss",
    "c51.py": "losses/loss",
    "c51_atari.py": "losses/loss",
}
ATARI_SMALL = ["--buffer-size", "5000", "--eval-episodes", "1"]


def network_for(module, script):
    if "atari" in script:
        spaces = types.SimpleNamespace(
            single_observation_space=gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
            single_action_space=gym.spaces.Discrete(4),
        )
    else:
        env = gym.make("CartPole-v1")
        spaces = types.SimpleNamespace(
            single_observation_space=env.observation_space, single_action_space=env.action_space
        )
        env.close()
    return module.QNetwork(spaces)


@pytest.mark.parametrize("num_envs", [1, 2])
@pytest.mark.parametrize("script", sorted(LOSS_TAG))
def test_tiny_run_with_gradient_steps(script, num_envs, workdir):
    flags = ["--learning-starts", "200", "--total-timesteps", "400", "--num-envs", str(num_envs)]
    if "atari" in script:
        flags += ATARI_SMALL
    save = num_envs == 2  # the two-env run also saves, reloads and evaluates the model
    if save:
        flags += ["--save-model", "--eval-episodes", "2" if "atari" not in script else "1"]
    proc = run_script(script, flags, workdir)
    check_ok(proc)
    run_dir = only_run_dir(workdir)
    scalars = read_scalars(run_dir)
    train_frequency = 4 if "atari" in script else 10
    updates = (400 - 200) // train_frequency
    assert len(scalars[LOSS_TAG[script]]) == updates // 10  # logged every 10 gradient steps
    assert len(scalars["losses/q_values"]) == updates // 10
    assert scalars["charts/SPS"][-1][0] <= 400
    if "atari" not in script:
        assert scalars["charts/episodic_return"]
    if save:
        saved = torch.load(run_dir / f"{script[:-3]}.cleanrl_model", weights_only=True)
        network_for(load_script_module(script), script).load_state_dict(saved["model_state_dict"])
        expected = 2 if "atari" not in script else 1
        assert len(scalars["eval/episodic_return"]) == expected


@pytest.mark.parametrize("script", ["c51.py", "c51_atari.py"])
def test_c51_projection(script):
    project = load_script_module(script).project
    atoms = torch.linspace(-10, 10, 21)
    pmfs = torch.softmax(torch.randn(3, 21), dim=1)
    # gamma 1, reward 0, not terminated: the distribution is unchanged.
    same = project(pmfs, torch.zeros(3), torch.zeros(3), atoms, 1.0)
    torch.testing.assert_close(same, pmfs)
    # terminated with reward 2.5: all mass on 2.5, split between the atoms 2 and 3.
    term = project(pmfs, torch.full((3,), 2.5), torch.ones(3), atoms, 0.99)
    torch.testing.assert_close(term[:, 12], torch.full((3,), 0.5))
    torch.testing.assert_close(term[:, 13], torch.full((3,), 0.5))
    # a shifted, clipped distribution keeps its total mass
    shifted = project(pmfs, torch.full((3,), 7.3), torch.zeros(3), atoms, 0.9)
    torch.testing.assert_close(shifted.sum(1), torch.ones(3))
    expected_mean = (pmfs * (7.3 + 0.9 * atoms).clamp(-10, 10)).sum(1)
    torch.testing.assert_close((shifted * atoms).sum(1), expected_mean)


# Flags chosen for the tests; the scripts' defaults stay the classic CleanRL ones.
LEARN_FLAGS = ["--total-timesteps", "150000", "--learning-rate", "1e-3", "--buffer-size", "50000",
               "--batch-size", "128", "--learning-starts", "5000", "--train-frequency", "4",
               "--target-network-frequency", "500", "--exploration-fraction", "0.2", "--end-e", "0.02",
               "--seed", "1"]  # fmt: skip


@pytest.mark.parametrize("script", ["dqn.py", "c51.py"])
def test_solves_cartpole_within_150k_steps(script, workdir):
    check_ok(run_script(script, LEARN_FLAGS, workdir, timeout=900))
    returns = read_scalars(only_run_dir(workdir))["charts/episodic_return"]
    first = None
    for i in range(19, len(returns)):
        if np.mean([v for _, v in returns[i - 19 : i + 1]]) >= 475:
            first = returns[i][0]
            break
    assert first is not None and first <= 150_000, f"never reached 475; last returns {returns[-20:]}"
