"""Replay buffers for the off-policy scripts, fed straight from a gymnasium vector env.

Both buffers take one call per vector step, ``add(obs, actions, rewards, terminations,
truncations, next_obs)``, with the vector env in gymnasium's default next-step autoreset mode
(``AutoresetMode.NEXT_STEP``): the step *after* an episode end is a reset step whose action is
ignored and whose reward is 0. The buffers remember which envs ended on the previous call and
never store that reset step as a transition. A transition that ended by truncation keeps its
real final observation as ``next_obs`` (the env returned it), so it can be bootstrapped; only
``terminations`` stop the bootstrap.

- ``ReplayBuffer``: flat (vector) observations, stored as given.
- ``AtariFrameBuffer``: frame-stacked Atari observations (``FrameStackObservation``), stored as
  one 84x84 uint8 frame per env step; 4-frame stacks are rebuilt at sampling time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Batch:
    observations: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_observations: torch.Tensor
    terminations: torch.Tensor
    truncations: torch.Tensor


class ReplayBuffer:
    """Uniform replay of transitions with vector observations, ``capacity`` transitions in a ring."""

    def __init__(self, capacity, num_envs, obs_shape, action_shape=(), obs_dtype=np.float32, action_dtype=np.int64):
        if capacity < 1 or num_envs < 1:
            raise ValueError("capacity and num_envs must be positive")
        self.capacity = capacity
        self.num_envs = num_envs
        self.observations = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.next_observations = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((capacity, *action_shape), dtype=action_dtype)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.terminations = np.zeros(capacity, dtype=np.bool_)
        self.truncations = np.zeros(capacity, dtype=np.bool_)
        self.pos = 0
        self.size = 0
        self._in_reset_step = np.zeros(num_envs, dtype=np.bool_)

    def add(self, obs, actions, rewards, terminations, truncations, next_obs):
        keep = ~self._in_reset_step  # a reset step is not a transition
        self._in_reset_step = np.logical_or(terminations, truncations)
        for i in np.nonzero(keep)[0]:
            self.observations[self.pos] = obs[i]
            self.next_observations[self.pos] = next_obs[i]
            self.actions[self.pos] = actions[i]
            self.rewards[self.pos] = rewards[i]
            self.terminations[self.pos] = terminations[i]
            self.truncations[self.pos] = truncations[i]
            self.pos = (self.pos + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size, rng: np.random.Generator, device="cpu") -> Batch:
        idx = rng.integers(0, self.size, size=batch_size)
        return _to_batch(
            self.observations[idx], self.actions[idx], self.rewards[idx], self.next_observations[idx],
            self.terminations[idx], self.truncations[idx], device,
        )  # fmt: skip

    _STATE = ("observations", "next_observations", "actions", "rewards", "terminations", "truncations",
              "_in_reset_step")  # fmt: skip

    def state_dict(self) -> dict:
        """Contents as tensors (loadable with ``torch.load(weights_only=True)``) for a checkpoint."""
        state = {name: torch.from_numpy(getattr(self, name)[: self.size].copy()) for name in self._STATE[:-1]}
        state.update(pos=self.pos, size=self.size, in_reset_step=torch.from_numpy(self._in_reset_step.copy()))
        return state

    def load_state_dict(self, state: dict) -> None:
        n = min(int(state["size"]), self.capacity)
        for name in self._STATE[:-1]:
            getattr(self, name)[:n] = state[name][:n].numpy()
        # Same capacity: continue overwriting where the saved buffer would have; else after the restored rows.
        self.size = n
        self.pos = int(state["pos"]) % self.capacity if n == self.capacity else n % self.capacity
        self._in_reset_step = state["in_reset_step"].numpy().copy()

    @property
    def nbytes(self) -> int:
        arrays = (self.observations, self.next_observations, self.actions, self.rewards)
        return sum(a.nbytes for a in arrays) + self.terminations.nbytes + self.truncations.nbytes


class AtariFrameBuffer:
    """Replay of frame-stacked Atari transitions that stores every 84x84 frame once.

    Each env has a ring of ``capacity // num_envs`` slots; slot t holds the newest frame of the
    observation the env returned at its step t, the action taken from it, the reward, the
    termination/truncation flags of that transition, and where its episode started. A stack is
    rebuilt from the ``stack`` newest frames of the same episode; before the episode start it
    repeats the first frame, as ``FrameStackObservation``'s default padding does after a reset.
    A slot is sampled as a transition only if (a) it was not the final observation of an episode
    (the step from it is the reset step), (b) the next slot is written, and (c) the frames its
    stack needs have not been overwritten by the ring. Memory: 7,056 bytes of frame plus 19 bytes
    of bookkeeping per slot.
    """

    def __init__(self, capacity, num_envs, frame_shape=(84, 84), stack=4):
        if capacity < num_envs * (stack + 2):
            raise ValueError(f"capacity {capacity} is too small for {num_envs} envs with {stack}-frame stacks")
        self.num_envs = num_envs
        self.stack = stack
        self.slots = capacity // num_envs  # per env
        self.capacity = self.slots * num_envs
        self.frames = np.zeros((num_envs, self.slots, *frame_shape), dtype=np.uint8)
        self.actions = np.zeros((num_envs, self.slots), dtype=np.int32)
        self.rewards = np.zeros((num_envs, self.slots), dtype=np.float32)
        self.terminations = np.zeros((num_envs, self.slots), dtype=np.bool_)
        self.truncations = np.zeros((num_envs, self.slots), dtype=np.bool_)
        self.has_next = np.zeros((num_envs, self.slots), dtype=np.bool_)  # a real transition leaves this slot
        self.episode_start = np.zeros(
            (num_envs, self.slots), dtype=np.int64
        )  # absolute step of the episode's first slot
        self.t = 0  # absolute step of the newest written slot (the same for every env)
        self.started = False
        self._count = 0
        self._in_reset_step = np.zeros(num_envs, dtype=np.bool_)

    def _write_frame(self, abs_step, obs, new_episode):
        slot = abs_step % self.slots
        self.frames[:, slot] = obs[:, -1]
        self._count -= int(self.has_next[:, slot].sum())  # transitions overwritten by the ring
        self.has_next[:, slot] = False
        self.episode_start[:, slot] = np.where(
            new_episode, abs_step, self.episode_start[:, (abs_step - 1) % self.slots]
        )

    def add(self, obs, actions, rewards, terminations, truncations, next_obs):
        obs, next_obs = np.asarray(obs), np.asarray(next_obs)
        if not self.started:
            self.t = 0
            self._write_frame(0, obs, np.ones(self.num_envs, dtype=np.bool_))
            self.started = True
        slot = self.t % self.slots
        real = ~self._in_reset_step
        self.actions[:, slot] = actions
        self.rewards[:, slot] = rewards
        self.terminations[:, slot] = terminations
        self.truncations[:, slot] = truncations
        # The step out of a final observation is gymnasium's reset step: its next_obs starts a new episode.
        new_episode = self._in_reset_step.copy()
        self._in_reset_step = np.logical_or(terminations, truncations)
        self.t += 1
        self._write_frame(self.t, next_obs, new_episode)
        self.has_next[:, slot] = real
        self._count += int(real.sum())

    @property
    def size(self) -> int:
        """Number of real transitions held (all envs); the few whose stack reaches past the oldest
        retained frame are held but not sampled."""
        return self._count

    def _slot_steps(self, slot_idx):
        """Absolute step held by each slot (the same for every env); negative for never-written slots."""
        return self.t - ((self.t - slot_idx) % self.slots)

    def _sampleable(self, env_idx, slot_idx):
        steps = self._slot_steps(slot_idx)
        oldest = max(0, self.t - self.slots + 1)
        # The stack of slot s reaches back to s - stack + 1 unless its episode started later.
        need_from = np.maximum(steps - self.stack + 1, self.episode_start[env_idx, slot_idx])
        return self.has_next[env_idx, slot_idx] & (steps >= oldest) & (steps < self.t) & (need_from >= oldest)

    def _stacks(self, env_idx, abs_steps, episode_starts, length=None):
        """The ``length`` (default ``stack``) newest frames up to ``abs_steps``, padded at the episode start."""
        offsets = np.arange(-(length or self.stack) + 1, 1)
        steps = np.maximum(abs_steps[:, None] + offsets[None, :], episode_starts[:, None])
        return self.frames[env_idx[:, None], steps % self.slots]

    def sample(self, batch_size, rng: np.random.Generator, device="cpu") -> Batch:
        # Rejection sampling: uniform over sampleable transitions without scanning the whole buffer.
        written = min(self.t + 1, self.slots)
        env_parts, slot_parts, found = [], [], 0
        for _ in range(1000):
            env_idx = rng.integers(0, self.num_envs, size=2 * batch_size)
            slot_idx = rng.integers(0, written, size=2 * batch_size)
            ok = self._sampleable(env_idx, slot_idx)
            env_parts.append(env_idx[ok])
            slot_parts.append(slot_idx[ok])
            found += int(ok.sum())
            if found >= batch_size:
                break
        else:
            raise ValueError("the buffer holds no complete transition yet")
        env_idx = np.concatenate(env_parts)[:batch_size]
        slot_idx = np.concatenate(slot_parts)[:batch_size]
        abs_steps = self._slot_steps(slot_idx)
        starts = self.episode_start[env_idx, slot_idx]
        # One window of stack + 1 frames serves both: obs is its start, next_obs its end (the same
        # episode, since the transition is real), so each frame is gathered once.
        window = self._stacks(env_idx, abs_steps + 1, starts, length=self.stack + 1)
        obs, next_obs = window[:, :-1], window[:, 1:]
        return _to_batch(
            obs, self.actions[env_idx, slot_idx], self.rewards[env_idx, slot_idx], next_obs,
            self.terminations[env_idx, slot_idx], self.truncations[env_idx, slot_idx], device,
        )  # fmt: skip

    _ARRAYS = ("frames", "actions", "rewards", "terminations", "truncations", "has_next", "episode_start")

    def state_dict(self) -> dict:
        """Contents as tensors (loadable with ``torch.load(weights_only=True)``) for a checkpoint."""
        state = {name: torch.from_numpy(getattr(self, name).copy()) for name in self._ARRAYS}
        state.update(
            t=self.t,
            started=self.started,
            count=self._count,
            in_reset_step=torch.from_numpy(self._in_reset_step.copy()),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        if tuple(state["frames"].shape) != self.frames.shape:
            raise ValueError(f"the saved buffer has shape {tuple(state['frames'].shape)}, this one {self.frames.shape}")
        for name in self._ARRAYS:
            getattr(self, name)[...] = state[name].numpy()
        self.t, self.started, self._count = int(state["t"]), bool(state["started"]), int(state["count"])
        self._in_reset_step = state["in_reset_step"].numpy().copy()

    @property
    def nbytes(self) -> int:
        arrays = (self.frames, self.actions, self.rewards, self.terminations, self.truncations, self.has_next)
        return sum(a.nbytes for a in arrays) + self.episode_start.nbytes

    @property
    def bytes_per_transition(self) -> float:
        return self.nbytes / self.capacity


def _to_batch(obs, actions, rewards, next_obs, terminations, truncations, device) -> Batch:
    return Batch(
        observations=torch.as_tensor(obs, device=device),
        actions=torch.as_tensor(actions, device=device),
        rewards=torch.as_tensor(rewards, dtype=torch.float32, device=device),
        next_observations=torch.as_tensor(next_obs, device=device),
        terminations=torch.as_tensor(terminations, dtype=torch.float32, device=device),
        truncations=torch.as_tensor(truncations, dtype=torch.float32, device=device),
    )
