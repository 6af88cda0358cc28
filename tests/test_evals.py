"""cleanrl_utils.evals: the recurrent policy's state is reset exactly at the first observation of each episode."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn

from cleanrl_utils.evals import ModelFileError, evaluate, load_model_file


class Countdown(gym.Env):
    """Observation = the step index within the episode (0 after a reset); every episode lasts 3 steps."""

    observation_space = gym.spaces.Box(0, 10, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t == 3, False, {}


def make_env(env_id, idx, capture_video, run_name):
    return lambda: gym.wrappers.RecordEpisodeStatistics(Countdown())


class RecordingAgent(nn.Module):
    """Stands in for ppo_atari_lstm's Agent: records which observations it was told start an episode."""

    calls: list[tuple[float, float]] = []

    def __init__(self, envs, lstm_hidden_size=4):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def initial_state(self, num_envs, device=None):
        return torch.zeros(1, num_envs, 4), torch.zeros(1, num_envs, 4)

    def get_action_and_value(self, x, lstm_state, done, action=None):
        RecordingAgent.calls.append((float(x[0, 0]), float(done[0])))
        zeros = torch.zeros(len(x))
        return torch.zeros(len(x), dtype=torch.long), zeros, zeros, zeros, lstm_state


def save(tmp_path, script="ppo_atari_lstm"):
    path = tmp_path / "m.cleanrl_model"
    state = RecordingAgent(None).state_dict()
    torch.save({"script": script, "env_id": "x", "args": {"lstm_hidden_size": 4}, "model_state_dict": state}, path)
    return str(path)


def test_recurrent_state_resets_at_the_first_observation_of_each_episode(tmp_path):
    RecordingAgent.calls = []
    returns = evaluate(save(tmp_path), make_env, "x", 3, "eval", RecordingAgent)
    assert returns == [3.0, 3.0, 3.0]
    # Next-step autoreset: after the step that ends an episode (obs 3) comes the reset step, whose action
    # is ignored; the episode start flag must be on the observation 0 that follows it, and only there.
    starts = [obs for obs, done in RecordingAgent.calls if done]
    assert starts == [0.0, 0.0, 0.0]
    assert all(done == (obs == 0.0) for obs, done in RecordingAgent.calls)


def test_model_file_checks(tmp_path):
    path = save(tmp_path)
    with pytest.raises(ModelFileError, match="saved by ppo_atari_lstm.py, not dqn.py"):
        load_model_file(path, "dqn")
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model_file(str(tmp_path / "none.cleanrl_model"))
    with pytest.raises(ModelFileError, match="has no evaluation"):
        load_model_file(save(tmp_path, script="unknown_script"))
