"""DQN-style Atari preprocessing as gymnasium 1.x wrappers.

The stack used by the Atari scripts (Mnih et al. 2015, Machado et al. 2018 for the caveats) is,
from the raw ``*NoFrameskip-v4`` env outwards::

    RecordEpisodeStatistics   # real game returns, before any life/reward surgery
    NoopResetEnv(noop_max=30) # random start state
    MaxAndSkipEnv(skip=4)     # act every 4th frame, max over the last two to undo sprite flicker
    EpisodicLifeEnv           # a lost life ends the *training* episode
    FireResetEnv              # games that wait for FIRE after a reset
    ClipRewardEnv             # reward -> sign(reward)
    ResizeObservation(84, 84), GrayscaleObservation, FrameStackObservation(4)   # gymnasium's own

``make_atari_env`` is not provided on purpose: each script shows its own stack in ``make_env``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def _ale(env: gym.Env):
    ale = getattr(env.unwrapped, "ale", None)
    if ale is None:
        raise ValueError(f"{env.spec.id if env.spec else env} is not an ALE (Atari) environment")
    return ale


class NoopResetEnv(gym.Wrapper):
    """On reset, take a random number (1..noop_max) of NOOP actions so starts differ."""

    def __init__(self, env: gym.Env, noop_max: int = 30):
        super().__init__(env)
        if noop_max < 1:
            raise ValueError(f"noop_max must be >= 1, got {noop_max}")
        meanings = env.unwrapped.get_action_meanings()
        if meanings[0] != "NOOP":
            raise ValueError(f"action 0 of {env.spec.id if env.spec else env} is {meanings[0]}, not NOOP")
        self.noop_max = noop_max
        self.noop_action = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        # The unwrapped env's generator is seeded by reset(seed=...), so the number of no-ops is
        # reproducible per seed.
        noops = int(self.unwrapped.np_random.integers(1, self.noop_max + 1))
        for _ in range(noops):
            obs, _, terminated, truncated, info = self.env.step(self.noop_action)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkipEnv(gym.Wrapper):
    """Repeat the action ``skip`` times, sum the rewards, return the max of the last two frames."""

    def __init__(self, env: gym.Env, skip: int = 4):
        super().__init__(env)
        if skip < 1:
            raise ValueError(f"skip must be >= 1, got {skip}")
        self.skip = skip

    def step(self, action):
        total_reward = 0.0
        previous = last = None
        for _ in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            previous, last = last, obs
            total_reward += float(reward)
            if terminated or truncated:
                break
        # Some Atari sprites are drawn only on every other frame: the max of the last two frames
        # shows them all. After a single step (the episode ended at once) there is one frame.
        frame = last if previous is None else np.maximum(previous, last)
        return frame, total_reward, terminated, truncated, info


class EpisodicLifeEnv(gym.Wrapper):
    """A lost life terminates the training episode; the emulator only resets on real game over.

    ``info["lives"]`` keeps reporting the lives left, and returns/lengths of the real game come
    from a ``RecordEpisodeStatistics`` wrapper placed *below* this one.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.was_real_done = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = _ale(self.env).lives()
        if 0 < lives < self.lives:
            # Some games report lives==0 one step before the game is over; only a decrease to a
            # positive count is a lost life here, the real end comes through `terminated`.
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            # Continue the same game from where the life was lost with one NOOP step.
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        self.lives = _ale(self.env).lives()
        return obs, info


class FireResetEnv(gym.Wrapper):
    """Press FIRE (then action 2) after every reset, for games that wait for it to start."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if len(meanings) < 3 or meanings[1] != "FIRE":
            raise ValueError(f"{env.spec.id if env.spec else env} has no FIRE action at index 1: {meanings}")

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset()
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset()
        return obs, info


class ClipRewardEnv(gym.RewardWrapper):
    """Clip rewards to their sign {-1, 0, +1} so one learning rate fits every game."""

    def reward(self, reward):
        return float(np.sign(reward))


def has_fire_action(env: gym.Env) -> bool:
    return "FIRE" in env.unwrapped.get_action_meanings()
