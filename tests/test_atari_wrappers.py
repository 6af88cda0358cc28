"""Each Atari wrapper on a real ALE env."""

from __future__ import annotations

import ale_py
import gymnasium as gym
import numpy as np
import pytest

from cleanrl_utils.atari_wrappers import (
    ClipRewardEnv,
    EpisodicLifeEnv,
    FireResetEnv,
    MaxAndSkipEnv,
    NoopResetEnv,
    has_fire_action,
)

gym.register_envs(ale_py)


class Recorder(gym.Wrapper):
    """Records every action, observation and reward that passes through it."""

    def __init__(self, env):
        super().__init__(env)
        self.actions, self.observations, self.rewards = [], [], []
        self.resets = 0

    def reset(self, **kwargs):
        self.resets += 1
        self.actions.clear()
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.actions.append(action)
        self.observations.append(obs.copy())
        self.rewards.append(reward)
        return obs, reward, terminated, truncated, info


def breakout():
    return gym.make("BreakoutNoFrameskip-v4")


def test_noop_reset_takes_between_1_and_noop_max_noops():
    counts = set()
    for seed in range(12):
        rec = Recorder(breakout())
        env = NoopResetEnv(rec, noop_max=30)
        env.reset(seed=seed)
        assert 1 <= len(rec.actions) <= 30
        assert set(rec.actions) == {0}
        assert rec.unwrapped.ale.getEpisodeFrameNumber() == len(rec.actions)
        counts.add(len(rec.actions))
        env.close()
    assert len(counts) > 1, "the number of no-ops should vary with the seed"


def test_noop_reset_is_reproducible_per_seed():
    lengths = []
    for _ in range(2):
        rec = Recorder(breakout())
        NoopResetEnv(rec, noop_max=30).reset(seed=123)
        lengths.append(len(rec.actions))
    assert lengths[0] == lengths[1]


def test_max_and_skip_returns_max_of_last_two_frames_and_sums_rewards():
    rec = Recorder(breakout())
    env = MaxAndSkipEnv(rec, skip=4)
    env.reset(seed=0)
    env.step(1)  # FIRE launches the ball so that frames and rewards change
    rng = np.random.default_rng(0)
    saw_reward = saw_difference = False
    for _ in range(400):
        rec.observations.clear()
        rec.rewards.clear()
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(4)))
        if terminated or truncated:
            break
        assert len(rec.observations) == 4  # the action was repeated four times
        np.testing.assert_array_equal(obs, np.maximum(rec.observations[-2], rec.observations[-1]))
        assert reward == sum(rec.rewards)
        saw_reward |= reward > 0
        saw_difference |= not np.array_equal(rec.observations[-2], rec.observations[-1])
    assert saw_difference
    assert saw_reward, "expected at least one brick within 400 agent steps"


def test_max_and_skip_stops_at_episode_end():
    rec = Recorder(breakout())
    env = MaxAndSkipEnv(rec, skip=4)
    env.reset(seed=0)
    while True:
        rec.observations.clear()
        _, _, terminated, truncated, _ = env.step(1)
        if terminated or truncated:
            break
    assert 1 <= len(rec.observations) <= 4


def test_episodic_life_ends_training_episode_but_game_continues():
    raw = breakout()
    env = EpisodicLifeEnv(MaxAndSkipEnv(raw, skip=4))
    env.reset(seed=0)
    ale = raw.unwrapped.ale
    assert ale.lives() == 5
    terminated = False
    for _ in range(2000):
        _, _, terminated, truncated, info = env.step(1)  # FIRE then nothing: the ball is lost
        if terminated:
            break
    assert terminated, "losing a life must end the training episode"
    assert ale.lives() == 4 and not ale.game_over()
    frame_before = ale.getEpisodeFrameNumber()
    env.reset()
    # No real reset: same game, one life fewer, the frame counter keeps going.
    assert ale.lives() == 4
    assert ale.getEpisodeFrameNumber() > frame_before
    # Play out the whole game: after the last life, reset is a real reset.
    lost = 1
    for _ in range(20000):
        _, _, terminated, truncated, _ = env.step(1)
        if terminated:
            lost += 1
            if ale.game_over():
                break
            env.reset()
    assert ale.game_over() and lost == 5
    env.reset()
    assert ale.lives() == 5 and ale.getEpisodeFrameNumber() < 10


def test_fire_reset_presses_fire():
    rec = Recorder(breakout())
    env = FireResetEnv(rec)
    assert has_fire_action(env)
    env.reset(seed=0)
    assert rec.actions == [1, 2]
    assert rec.unwrapped.get_action_meanings()[1] == "FIRE"


def test_fire_reset_refuses_game_without_fire():
    env = gym.make("FreewayNoFrameskip-v4")
    assert not has_fire_action(env)
    with pytest.raises(ValueError, match="FIRE"):
        FireResetEnv(env)


def test_clip_reward_is_sign_of_raw_reward():
    rec = Recorder(breakout())
    env = ClipRewardEnv(MaxAndSkipEnv(rec, skip=4))
    env.reset(seed=0)
    rng = np.random.default_rng(1)
    seen = []
    for _ in range(1000):
        rec.rewards.clear()
        _, reward, terminated, truncated, _ = env.step(int(rng.integers(4)))
        raw = sum(rec.rewards)
        assert reward == np.sign(raw)
        seen.append(raw)
        if terminated or truncated:
            env.reset()
    assert max(seen) > 0, "expected some positive raw reward"
    assert ClipRewardEnv(breakout()).reward(7.0) == 1.0
    assert ClipRewardEnv(breakout()).reward(-3.0) == -1.0
    assert ClipRewardEnv(breakout()).reward(0.0) == 0.0


def test_full_stack_shapes():
    env = breakout()
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = NoopResetEnv(env)
    env = MaxAndSkipEnv(env)
    env = EpisodicLifeEnv(env)
    env = FireResetEnv(env)
    env = ClipRewardEnv(env)
    env = gym.wrappers.ResizeObservation(env, (84, 84))
    env = gym.wrappers.GrayscaleObservation(env)
    env = gym.wrappers.FrameStackObservation(env, 4)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    obs, *_ = env.step(0)
    assert obs.shape == (4, 84, 84)
