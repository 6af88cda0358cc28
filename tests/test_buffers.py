"""Replay buffers against what a real vector env returned (next-step autoreset)."""

from __future__ import annotations

import ale_py
import gymnasium as gym
import numpy as np
import pytest

from cleanrl_utils.atari_wrappers import ClipRewardEnv, EpisodicLifeEnv, FireResetEnv, MaxAndSkipEnv, NoopResetEnv
from cleanrl_utils.buffers import AtariFrameBuffer, ReplayBuffer

gym.register_envs(ale_py)


def atari_thunk(time_limit):
    def thunk():
        env = gym.make("BreakoutNoFrameskip-v4")
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = NoopResetEnv(env, noop_max=30)
        env = MaxAndSkipEnv(env, skip=4)
        env = EpisodicLifeEnv(env)
        env = FireResetEnv(env)
        env = ClipRewardEnv(env)
        env = gym.wrappers.ResizeObservation(env, (84, 84))
        env = gym.wrappers.GrayscaleObservation(env)
        env = gym.wrappers.FrameStackObservation(env, 4)
        return gym.wrappers.TimeLimit(env, time_limit)  # short episodes end by truncation too

    return thunk


def record(envs, steps, buffer, seed=0):
    """Step with random actions, feed the buffer, and return the real transitions by (env, step)."""
    truth = {}
    obs, _ = envs.reset(seed=seed)
    envs.action_space.seed(seed)
    in_reset_step = np.zeros(envs.num_envs, dtype=bool)
    for t in range(steps):
        actions = envs.action_space.sample()
        next_obs, rewards, terminations, truncations, _ = envs.step(actions)
        buffer.add(obs, actions, rewards, terminations, truncations, next_obs)
        for i in range(envs.num_envs):
            if not in_reset_step[i]:
                truth[(i, t)] = (
                    obs[i].copy(),
                    actions[i],
                    rewards[i],
                    next_obs[i].copy(),
                    terminations[i],
                    truncations[i],
                )
        in_reset_step = terminations | truncations
        obs = next_obs
    return truth


def test_atari_frame_buffer_rebuilds_the_env_stacks_across_episodes_and_the_wrap():
    envs = gym.vector.SyncVectorEnv([atari_thunk(37), atari_thunk(23)])
    buffer = AtariFrameBuffer(capacity=2 * 120, num_envs=2)
    truth = record(envs, 400, buffer)  # 400 steps into 120 slots per env: the ring wrapped
    envs.close()

    env_idx, slot_idx = np.indices((buffer.num_envs, buffer.slots)).reshape(2, -1)
    ok = buffer._sampleable(env_idx, slot_idx)
    env_idx, slot_idx = env_idx[ok], slot_idx[ok]
    steps = buffer._slot_steps(slot_idx)
    starts = buffer.episode_start[env_idx, slot_idx]
    obs = buffer._stacks(env_idx, steps, starts)
    next_obs = buffer._stacks(env_idx, steps + 1, starts)
    assert len(steps) > 150
    assert len(steps) <= buffer.size <= len(steps) + 2 * 3  # held, minus stacks cut by the ring
    oldest = buffer.t - buffer.slots + 1
    for k, (e, t) in enumerate(zip(env_idx, steps, strict=True)):
        o, a, r, no, term, trunc = truth[(e, t)]  # KeyError would mean a reset step was stored
        np.testing.assert_array_equal(obs[k], o)
        np.testing.assert_array_equal(next_obs[k], no)
        assert buffer.actions[e, slot_idx[k]] == a and buffer.rewards[e, slot_idx[k]] == r
        assert buffer.terminations[e, slot_idx[k]] == term and buffer.truncations[e, slot_idx[k]] == trunc
    # Every real transition whose frames are all still in the ring can be sampled.
    sampled = set(zip(env_idx.tolist(), steps.tolist(), strict=True))
    retained = {key for key in truth if key[1] >= oldest + 3 and key[1] < buffer.t}
    assert retained <= sampled
    # The window held both kinds of episode end, and stacks that start inside an episode.
    assert buffer.terminations[env_idx, slot_idx].any() and buffer.truncations[env_idx, slot_idx].any()
    assert (starts > oldest).any()

    batch = buffer.sample(32, np.random.default_rng(0))
    assert batch.observations.shape == (32, 4, 84, 84) and batch.next_observations.shape == (32, 4, 84, 84)
    assert batch.observations.dtype.is_floating_point is False


def test_atari_frame_buffer_memory_per_transition():
    buffer = AtariFrameBuffer(capacity=1_000_000, num_envs=8)
    assert buffer.bytes_per_transition <= 7200
    assert buffer.nbytes < 7 * 2**30


def test_atari_frame_buffer_refuses_sampling_when_empty():
    buffer = AtariFrameBuffer(capacity=100, num_envs=1)
    with pytest.raises(ValueError):
        buffer.sample(4, np.random.default_rng(0))


def test_replay_buffer_skips_reset_steps_and_keeps_flags():
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=15)] * 2)
    buffer = ReplayBuffer(capacity=1000, num_envs=2, obs_shape=(4,))
    truth = record(envs, 100, buffer)
    envs.close()
    assert buffer.size == len(truth)  # exactly the real transitions, no reset step
    stored = {
        tuple(np.round(o, 6)) + tuple(np.round(n, 6))
        for o, n in zip(buffer.observations[: buffer.size], buffer.next_observations[: buffer.size], strict=True)
    }
    expected = {tuple(np.round(v[0], 6)) + tuple(np.round(v[3], 6)) for v in truth.values()}
    assert stored == expected
    assert buffer.truncations[: buffer.size].any()  # the time limit of 15 steps was hit
    # A truncated transition keeps its real final observation for bootstrapping.
    for v in truth.values():
        if v[5]:
            assert not np.allclose(v[3], 0)
    batch = buffer.sample(8, np.random.default_rng(0))
    assert batch.observations.shape == (8, 4) and batch.terminations.dtype.is_floating_point


def test_sampled_batches_match_the_env():
    envs = gym.vector.SyncVectorEnv([atari_thunk(29)])
    buffer = AtariFrameBuffer(capacity=150, num_envs=1)
    truth = record(envs, 200, buffer, seed=3)
    envs.close()
    # Identical stacks can recur (e.g. right after resets), so match a sample against every step with that stack.
    by_obs = {}
    for o, a, r, no, term, _ in truth.values():
        by_obs.setdefault(o.tobytes(), set()).add((no.tobytes(), int(a), float(r), float(term)))
    batch = buffer.sample(64, np.random.default_rng(1))
    for k in range(64):
        sampled = (
            batch.next_observations[k].numpy().tobytes(),
            int(batch.actions[k]),
            float(batch.rewards[k]),
            float(batch.terminations[k]),
        )
        assert sampled in by_obs[batch.observations[k].numpy().tobytes()]


def test_buffer_state_round_trip_through_a_checkpoint_file(tmp_path):
    import torch

    envs = gym.vector.SyncVectorEnv([atari_thunk(31), atari_thunk(17)])
    buffer = AtariFrameBuffer(capacity=2 * 60, num_envs=2)
    record(envs, 90, buffer)
    torch.save(buffer.state_dict(), tmp_path / "b.pt")
    restored = AtariFrameBuffer(capacity=2 * 60, num_envs=2)
    restored.load_state_dict(torch.load(tmp_path / "b.pt", weights_only=True))
    a = buffer.sample(16, np.random.default_rng(5))
    b = restored.sample(16, np.random.default_rng(5))
    assert torch.equal(a.observations, b.observations) and torch.equal(a.next_observations, b.next_observations)
    assert restored.size == buffer.size

    flat = ReplayBuffer(capacity=50, num_envs=2, obs_shape=(4,))
    cartpole = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=15)] * 2)
    record(cartpole, 20, flat)
    cartpole.close()
    torch.save(flat.state_dict(), tmp_path / "f.pt")
    flat2 = ReplayBuffer(capacity=50, num_envs=2, obs_shape=(4,))
    flat2.load_state_dict(torch.load(tmp_path / "f.pt", weights_only=True))
    assert flat2.size == flat.size
    np.testing.assert_array_equal(flat2.observations[: flat.size], flat.observations[: flat.size])
    envs.close()
