"""A tiny continuous-control task with asymmetric action bounds that refuses any action outside them.

Importing this module registers ``bounds_env:AsymmetricBounds-v0`` (gymnasium's ``module:id``
form imports it for ``gym.make``). The action space is 2-D with one dimension entirely negative
and one entirely positive, so a script that maps its actor onto ``[-1, 1]`` or onto a symmetric
``[-high, high]`` sends out-of-bounds actions and the env raises. Every action it receives is
appended to ``$BOUNDS_ENV_LOG`` (one line per step) when that variable is set.
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np

LOW = np.array([-3.0, 0.5], dtype=np.float32)
HIGH = np.array([-1.0, 4.0], dtype=np.float32)


class AsymmetricBounds(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, episode_length: int = 50):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Box(LOW, HIGH, dtype=np.float32)
        self.episode_length = episode_length
        self._log = os.environ.get("BOUNDS_ENV_LOG")
        self._t = 0
        self._state = np.zeros(3, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._state = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return self._state.copy(), {}

    def step(self, action):
        action = np.asarray(action, dtype=np.float32)
        if action.shape != LOW.shape or not (np.all(action >= LOW) and np.all(action <= HIGH)):
            raise ValueError(f"action {action!r} outside the bounds [{LOW}, {HIGH}]")
        if self._log:
            with open(self._log, "a") as f:
                f.write(f"{float(action[0])!r} {float(action[1])!r}\n")
        self._t += 1
        # Reward the agent for an action in the middle of the box, depending on the state.
        target = (LOW + HIGH) / 2 + 0.5 * self._state[:2]
        reward = -float(np.sum((action - target) ** 2))
        self._state = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return self._state.copy(), reward, False, self._t >= self.episode_length, {}


gym.register("AsymmetricBounds-v0", entry_point=AsymmetricBounds)
