"""Procgen (Cobbe et al. 2020) as a gymnasium vector environment, for the procgen scripts.

Procgen's own interface is a gym3 vector env from the ``procgen-mirror`` package, which declares
``numpy<2`` and ``gym<1`` although it runs fine next to numpy 2 (see
``requirements/requirements-procgen*.txt`` for how to install it without those pins). This module
hides it behind :class:`gymnasium.vector.VectorEnv`: observations ``(num_envs, 64, 64, 3)`` uint8,
``Discrete(15)`` actions, episode statistics in ``infos["episode"]`` / ``infos["_episode"]`` as
gymnasium's vector ``RecordEpisodeStatistics`` writes them.

Episode ends follow ``AutoresetMode.SAME_STEP``: procgen starts the next level inside the step that
ended the previous one, so the observation returned for a finished env is the first one of its
next episode. Procgen does not say whether an episode ended by dying, by finishing the level or by
its internal time limit, and it does not return the last observation, so every episode end is
reported as a termination (no truncations, no ``final_obs``), as in Cobbe et al.'s own training code.
"""

from __future__ import annotations

import contextlib
import io
import os

import gymnasium as gym
import numpy as np
from gymnasium.utils.save_video import capped_cubic_video_schedule, save_video
from gymnasium.vector import AutoresetMode, VectorEnv

# The 16 games of procgen 0.10, known without importing procgen so that a typo is reported even on
# a machine where procgen is not installed.
ENV_NAMES = (
    "bigfish",
    "bossfight",
    "caveflyer",
    "chaser",
    "climber",
    "coinrun",
    "dodgeball",
    "fruitbot",
    "heist",
    "jumper",
    "leaper",
    "maze",
    "miner",
    "ninja",
    "plunder",
    "starpilot",
)
DISTRIBUTION_MODES = ("easy", "hard", "extreme", "memory", "exploration")
INSTALL_HINT = (
    "pip install -r requirements/requirements-procgen.txt && "
    "pip install --no-deps -r requirements/requirements-procgen-nodeps.txt"
)


def game_name(env_id: str) -> str | None:
    """The procgen game meant by an id a researcher might type, or None.

    ``starpilot``, ``StarPilot``, ``StarPilot-v0``, ``procgen-starpilot-v0`` and
    ``procgen:procgen-starpilot-v0`` (the old gym ids) all mean ``starpilot``.
    """
    name = env_id.strip().lower()
    for prefix in ("procgen:", "procgen-"):
        name = name.removeprefix(prefix)
    name = name.removesuffix("-v0")
    return name if name in ENV_NAMES else None


def _import_procgen():
    # procgen imports gym 0.26 only to register gym ids that we never use, and gym prints a
    # multi-line "unmaintained" notice on stderr at import time; keep it out of the users' logs.
    with contextlib.redirect_stderr(io.StringIO()):
        import procgen
    return procgen


def procgen_unavailable_reason() -> str | None:
    """None when procgen imports and runs here; otherwise one line saying why and how to fix it."""
    try:
        procgen = _import_procgen()
        env = procgen.ProcgenGym3Env(num=1, env_name="coinrun", num_threads=0, rand_seed=0)
        env.act(np.zeros(1, dtype=np.int32))
        env.observe()
        env.close()
    except Exception as e:  # ImportError, a missing shared library, an ABI mismatch: all mean "not usable"
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"procgen is not usable here ({type(e).__name__}: {first_line}); install it with: {INSTALL_HINT}"
    return None


class ProcgenVectorEnv(VectorEnv):
    """``num_envs`` copies of one procgen game, stepped together in procgen's C++ thread pool.

    ``num_levels=0`` draws from the unbounded set of levels; ``num_levels=N`` restricts training to
    levels ``start_level .. start_level+N-1`` (the generalisation setting of Cobbe et al.).
    With ``video_folder`` set, episodes of env 0 are written there as mp4 (on gymnasium's
    capped-cubic schedule), upscaled 4x from the 64x64 frames the agent sees.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_fps": 15}

    def __init__(
        self,
        env_name: str,
        num_envs: int,
        num_levels: int = 0,
        start_level: int = 0,
        distribution_mode: str = "easy",
        seed: int | None = None,
        num_threads: int | None = None,
        video_folder: str | None = None,
    ):
        game = game_name(env_name)
        if game is None:
            raise ValueError(f"unknown procgen game {env_name!r}; one of {', '.join(ENV_NAMES)}")
        if distribution_mode not in DISTRIBUTION_MODES:
            raise ValueError(f"unknown distribution mode {distribution_mode!r}; one of {', '.join(DISTRIBUTION_MODES)}")
        self._procgen = _import_procgen()
        self.game, self.num_envs = game, num_envs
        self._options = {
            "num_levels": num_levels,
            "start_level": start_level,
            "distribution_mode": distribution_mode,
            # More threads than cores only adds context switches.
            "num_threads": num_threads if num_threads is not None else min(4, os.cpu_count() or 1),
        }
        self.single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.single_action_space = gym.spaces.Discrete(15)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.video_folder = video_folder
        self._frames: list[np.ndarray] = []
        self._video_episode = 0
        self._env = None
        self._make(seed)

    def _make(self, seed):
        if self._env is not None:
            self._env.close()
        # procgen draws its own seed from the OS when given none; a seed makes the levels reproducible.
        rand_seed = None if seed is None else int(seed) % (2**31 - 1)
        self._env = self._procgen.ProcgenGym3Env(
            num=self.num_envs, env_name=self.game, rand_seed=rand_seed, **self._options
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        # A gym3 env cannot be reset on demand: a reset starts a fresh one (new levels for every env).
        if seed is not None:
            self._make(seed)
            self.action_space.seed(seed)
        _, obs, _ = self._env.observe()
        obs = np.array(obs["rgb"])  # a copy: gym3 may reuse its buffer on the next step
        self._frames = [obs[0]] if self.video_folder else []
        return obs, {}

    def step(self, actions):
        self._env.act(np.asarray(actions, dtype=np.int32).reshape(self.num_envs))
        rewards, obs, first = self._env.observe()
        obs = np.array(obs["rgb"])
        terminations = np.asarray(first, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        if self.video_folder:
            self._record(obs[0], terminations[0])
        return obs, np.asarray(rewards, dtype=np.float64), terminations, truncations, {}

    def _record(self, frame, done):
        if done:
            if capped_cubic_video_schedule(self._video_episode):
                frames = [f.repeat(4, axis=0).repeat(4, axis=1) for f in self._frames]
                save_video(
                    frames,
                    self.video_folder,
                    episode_trigger=lambda _: True,
                    episode_index=self._video_episode,
                    fps=self.metadata["render_fps"],
                )
            self._video_episode += 1
            self._frames = []
        self._frames.append(frame)

    def close_extras(self, **kwargs):
        if self._env is not None:
            self._env.close()
        self._env = None


def make_procgen_env(
    env_name: str,
    num_envs: int,
    num_levels: int = 0,
    start_level: int = 0,
    distribution_mode: str = "easy",
    seed: int | None = None,
    video_folder: str | None = None,
) -> gym.vector.VectorEnv:
    """A procgen vector env with episode statistics (``infos["episode"]``, mask ``infos["_episode"]``)."""
    env = ProcgenVectorEnv(
        env_name,
        num_envs,
        num_levels=num_levels,
        start_level=start_level,
        distribution_mode=distribution_mode,
        seed=seed,
        video_folder=video_folder,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(env)
