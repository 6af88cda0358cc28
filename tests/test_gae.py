"""The GAE/return computation of every PPO script on a hand-made rollout with a termination and a truncation."""

from __future__ import annotations

import pytest
import torch

from conftest import load_script_module

PPO_SCRIPTS = ["ppo.py", "ppo_atari.py", "ppo_atari_multigpu.py", "ppo_continuous_action.py"]


def hand_made_rollout():
    # Two envs, four steps, gamma 0.9, lambda 0.8.
    # env 0: terminated at t=1, truncated at t=3 with V(final obs) = 2.0; next_value 9.0 must be ignored.
    # env 1: no episode end; bootstraps from next_value = 1.0.
    rewards = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    values = torch.tensor([[0.5, 0.0], [0.4, 0.0], [0.3, 0.0], [0.2, 0.0]])
    terminations = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    truncations = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    final_values = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [2.0, 0.0]])
    next_value = torch.tensor([9.0, 1.0])
    return rewards, values, terminations, truncations, final_values, next_value


# Worked by hand. env 0:
#   t=3 truncated: delta = 1 + 0.9*2.0 - 0.2 = 2.6                  A = 2.6
#   t=2:           delta = 1 + 0.9*0.2 - 0.3 = 0.88                 A = 0.88 + 0.72*2.6 = 2.752
#   t=1 terminated: delta = 1 + 0 - 0.4 = 0.6 (chain cut)           A = 0.6
#   t=0:           delta = 1 + 0.9*0.4 - 0.5 = 0.86                 A = 0.86 + 0.72*0.6 = 1.292
# env 1 (all values 0): delta = r_t + 0.9*V(next); only t=3 has r=1 and next_value 1 -> delta_3 = 1.9
#   A_3 = 1.9, A_2 = 0.72*1.9 = 1.368, A_1 = 0.72*1.368 = 0.98496, A_0 = 0.72*0.98496 = 0.7091712
EXPECTED_ADVANTAGES = torch.tensor([[1.292, 0.7091712], [0.6, 0.98496], [2.752, 1.368], [2.6, 1.9]])


@pytest.mark.parametrize("script", PPO_SCRIPTS)
def test_gae_with_termination_and_truncation(script):
    module = load_script_module(script)
    rollout = hand_made_rollout()
    advantages, returns = module.compute_gae(*rollout, gamma=0.9, gae_lambda=0.8)
    torch.testing.assert_close(advantages, EXPECTED_ADVANTAGES)
    torch.testing.assert_close(returns, EXPECTED_ADVANTAGES + rollout[1])


@pytest.mark.parametrize("script", PPO_SCRIPTS)
def test_termination_wins_over_truncation(script):
    # A step that is both terminated and truncated is not bootstrapped.
    module = load_script_module(script)
    one = torch.ones(1, 1)
    advantages, _ = module.compute_gae(
        rewards=one,
        values=torch.zeros(1, 1),
        terminations=one,
        truncations=one,
        final_values=5 * one,
        next_value=torch.tensor([7.0]),
        gamma=0.9,
        gae_lambda=0.8,
    )
    torch.testing.assert_close(advantages, one)


@pytest.mark.parametrize("script", PPO_SCRIPTS)
def test_lambda_one_gives_discounted_returns(script):
    # With lambda = 1 and no episode end, returns are the discounted sum of rewards plus the bootstrap.
    module = load_script_module(script)
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    zeros = torch.zeros(3, 1)
    _, returns = module.compute_gae(rewards, torch.rand(3, 1), zeros, zeros, zeros, torch.tensor([10.0]), 0.5, 1.0)
    torch.testing.assert_close(
        returns[:, 0], torch.tensor([1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 10, 2 + 0.5 * 3 + 0.25 * 10, 3 + 0.5 * 10])
    )
