"""`--env-backend ale`: ale_py's C++ vector env behind the interface and the semantics of make_env.

The adapter (AleVecEnv in both Atari PPO scripts) must turn every lost life into a termination
while the game goes on, clip rewards to their sign, report whole games with unclipped returns, and
hand over the final observation of a truncated game for bootstrapping. The checks step a raw ALE
vector env with the same seed and actions beside the adapter, so each step can be compared.
"""

from __future__ import annotations

import numpy as np
import pytest
from ale_py.vector_env import AtariVectorEnv
from gymnasium.vector import AutoresetMode

from conftest import check_ok, load_script_module, only_run_dir, read_scalars, run_script, train_two_ranks

SCRIPTS = ["ppo_atari.py", "ppo_atari_multigpu.py"]


def raw_twin(num_envs, max_frames=108_000, game="breakout"):
    """The emulators the adapter drives, without its bookkeeping: lives and unclipped rewards visible."""
    return AtariVectorEnv(game, num_envs, num_threads=1, autoreset_mode=AutoresetMode.SAME_STEP,
                          repeat_action_probability=0.0, episodic_life=False, reward_clipping=False,
                          max_num_frames_per_episode=max_frames)  # fmt: skip


def step_both(adapter, raw, steps, seed=3, allowed=None):
    """Step the adapter and the raw twin with the same actions; yields (adapter step, raw step, lives before)."""
    adapter.reset(seed=seed)
    _, info = raw.reset(seed=seed)
    rng = np.random.default_rng(seed)
    lives = info["lives"].copy()
    lost = np.zeros(adapter.num_envs, dtype=bool)
    for _ in range(steps):
        choices = allowed if allowed is not None else np.arange(adapter.single_action_space.n)
        actions = rng.choice(choices, adapter.num_envs)
        adapter.step_async(actions)
        got = adapter.step_wait()
        # The rule under test: the step after a lost life sends FIRE (action 1) whatever the agent chose.
        want = raw.step(np.where(lost, 1, actions))
        yield got, want, lives
        game_over = want[2] | want[3]
        lost = (want[4]["lives"] < lives) & ~game_over
        lives = want[4]["lives"].copy()


@pytest.mark.parametrize("script", SCRIPTS)
def test_lost_lives_terminate_rewards_are_clipped_and_games_are_reported_whole(script):
    module = load_script_module(script)
    # Space Invaders: rewards of 5 to 200 (so clipping shows), three lives, games of a few hundred steps.
    adapter = module.AleVecEnv("SpaceInvadersNoFrameskip-v4", 2, num_threads=1)
    raw = raw_twin(2, game="space_invaders")
    assert adapter.single_observation_space.shape == (4, 84, 84)
    assert adapter.single_action_space.n == 6
    returns = np.zeros(2)
    games, life_losses, continued = [], 0, 0
    for (obs, reward, terminated, truncated, infos), (
        raw_obs,
        raw_reward,
        raw_term,
        raw_trunc,
        raw_info,
    ), lives in step_both(adapter, raw, 2500):
        np.testing.assert_array_equal(obs, raw_obs)  # same emulators, same frames
        np.testing.assert_array_equal(reward, np.sign(raw_reward))  # clipped for learning
        assert reward.dtype == np.float32
        returns += raw_reward
        lost = (raw_info["lives"] < lives) & ~raw_term & ~raw_trunc
        life_losses += lost.sum()
        continued += (lost & (raw_info["lives"] > 0)).sum()
        np.testing.assert_array_equal(terminated, raw_term | lost)  # every lost life ends a learning episode
        np.testing.assert_array_equal(truncated, raw_trunc)
        game_over = raw_term | raw_trunc
        if game_over.any():
            episode = infos["final_info"]["episode"]
            np.testing.assert_array_equal(infos["final_info"]["_episode"], game_over)
            for i in np.nonzero(game_over)[0]:
                assert episode["r"][i] == returns[i]  # the whole game, unclipped
                assert episode["l"][i] > 0
                games.append(episode["r"][i])
                returns[i] = 0.0
        else:
            assert "final_info" not in infos
    assert len(games) >= 2 and life_losses >= 2 * len(games)  # three lives per game
    assert max(games) > 100  # unclipped: the clipped return of a game is a few dozen at most
    assert continued > 0  # after a lost life the same game went on (lives kept falling, no restart)
    adapter.close()
    raw.close()


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_step_after_a_lost_life_fires_so_breakout_never_stalls(script):
    # An agent that never chooses FIRE: in Breakout the ball only comes back with FIRE after a lost life.
    module = load_script_module(script)
    adapter, raw = module.AleVecEnv("BreakoutNoFrameskip-v4", 2, num_threads=1), raw_twin(2)
    life_losses = np.zeros(2, dtype=int)
    for (obs, _, terminated, _, _), (raw_obs, _, raw_term, _, _), _ in step_both(adapter, raw, 1500, allowed=[0, 2, 3]):
        np.testing.assert_array_equal(obs, raw_obs)  # the twin is sent FIRE after each lost life
        life_losses += terminated & ~raw_term
    assert (life_losses >= 4).all(), life_losses  # without the FIRE the first lost life would be the last
    adapter.close()
    raw.close()


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_truncated_game_hands_over_its_final_observation(script):
    module = load_script_module(script)
    adapter = module.AleVecEnv("BreakoutNoFrameskip-v4", 2, num_threads=1)
    adapter.envs.close()
    adapter.envs = raw_twin(2, max_frames=200)  # the same adapter over emulators with a short time limit
    raw = raw_twin(2, max_frames=200)
    seen = 0
    for (obs, _, _, truncated, infos), (_, _, _, raw_trunc, raw_info), _ in step_both(adapter, raw, 200):
        np.testing.assert_array_equal(truncated, raw_trunc)
        for i in np.nonzero(truncated)[0]:
            np.testing.assert_array_equal(infos["final_obs"][i], raw_info["final_obs"][i])
            assert not np.array_equal(infos["final_obs"][i], obs[i])  # obs is already the next game's first
            assert infos["final_info"]["_episode"][i]
            seen += 1
    assert seen >= 2
    adapter.close()
    raw.close()


@pytest.mark.parametrize("script", SCRIPTS)
def test_training_with_the_ale_backend_logs_whole_game_returns(script, workdir):
    flags = ["--env-backend", "ale", "--num-envs", "4", "--num-steps", "128", "--num-minibatches", "2",
             "--update-epochs", "1", "--total-timesteps", "2048", "--no-cuda", "--checkpoint-frequency", "0"]  # fmt: skip
    proc = run_script(script, flags, workdir)
    check_ok(proc)
    scalars = read_scalars(only_run_dir(workdir))
    returns = [v for _, v in scalars["charts/episodic_return"]]
    assert returns and all(r >= 0 for r in returns)
    lengths = [v for _, v in scalars["charts/episodic_length"]]
    assert min(lengths) > 100  # whole games of five lives, in emulator frames
    assert "losses/value_loss" in scalars


def test_ale_backend_under_torchrun_keeps_ranks_identical(workdir):
    flags = ["--env-backend", "ale", "--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2",
             "--update-epochs", "2", "--total-timesteps", "384", "--env-groups", "2", "--no-cuda"]  # fmt: skip
    train_two_ranks(flags, workdir)
