"""ppo_atari_lstm.py: the recurrent state is reset exactly at episode starts, both while acting and
while training on minibatches of env sequences; and the script run the way users run it."""

from __future__ import annotations

import types

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import (
    assert_continuous_log,
    check_ok,
    load_script_module,
    only_run_dir,
    read_scalars,
    run_script,
)

T, N, HIDDEN = 12, 4, 16
# Episode starts (dones[t, e] = 1: frame t of env e is the first of an episode): env 0 once, env 1
# on two consecutive frames, env 2 never, env 3 at the very first and the very last frame.
STARTS = {0: [5], 1: [5, 6], 2: [], 3: [0, 11]}


def make_agent(module, hidden=HIDDEN):
    spaces = types.SimpleNamespace(
        single_observation_space=gym.spaces.Box(0, 255, (84, 84), np.uint8), single_action_space=gym.spaces.Discrete(4)
    )
    torch.manual_seed(0)
    agent = module.Agent(spaces, lstm_hidden_size=hidden)
    # The script's 0.01-std policy head makes all log-probs ~log(1/4); a wide one makes every
    # difference in the LSTM output visible in them.
    torch.nn.init.normal_(agent.actor.weight, std=3.0)
    return agent


def rollout_logprobs(agent, obs, dones, actions, state):
    """Step by step, as the rollout loop acts: one frame of every env per call."""
    logps = []
    with torch.no_grad():
        for t in range(obs.shape[0]):
            _, logp, _, _, state = agent.get_action_and_value(obs[t], state, dones[t], actions[t])
            logps.append(logp)
    return torch.stack(logps)


@pytest.fixture(scope="module")
def data():
    gen = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (T, N, 84, 84), dtype=torch.uint8, generator=gen)
    actions = torch.randint(0, 4, (T, N), generator=gen)
    dones = torch.zeros(T, N)
    for env, starts in STARTS.items():
        dones[starts, env] = 1.0
    # A non-zero state before the rollout, as left by the previous one, so that a missed reset shows.
    initial = (torch.randn(1, N, HIDDEN, generator=gen), torch.randn(1, N, HIDDEN, generator=gen))
    return obs, dones, actions, initial


def test_training_pass_on_env_minibatches_matches_the_rollout(data):
    module = load_script_module("ppo_atari_lstm.py")
    agent = make_agent(module)
    obs, dones, actions, initial = data
    expected = rollout_logprobs(agent, obs, dones, actions, initial).reshape(-1)
    # The script's flat batch is time-major; minibatches are whole env sequences replayed from the
    # state the rollout started with.
    b_obs, b_dones, b_actions = obs.reshape(-1, 84, 84), dones.reshape(-1), actions.reshape(-1)
    np.random.seed(0)
    seen = []
    for mb_envs, mb_inds in module.env_minibatches(T, N, 2):
        assert len(mb_envs) == N // 2 and len(mb_inds) == T * N // 2
        with torch.no_grad():
            _, logp, _, _, _ = agent.get_action_and_value(
                b_obs[mb_inds], (initial[0][:, mb_envs], initial[1][:, mb_envs]), b_dones[mb_inds], b_actions[mb_inds]
            )
        torch.testing.assert_close(logp, expected[mb_inds], atol=1e-5, rtol=1e-5)
        seen += mb_inds.tolist()
    assert sorted(seen) == list(range(T * N))  # every row trained on once per epoch


@pytest.mark.parametrize("mode", ["rollout", "training"])
def test_state_is_reset_exactly_at_episode_starts(mode, data):
    module = load_script_module("ppo_atari_lstm.py")
    agent = make_agent(module)
    obs, dones, actions, initial = data

    def logprobs(obs, dones, actions, state):
        if mode == "rollout":
            return rollout_logprobs(agent, obs, dones, actions, state)
        steps, envs = actions.shape
        with torch.no_grad():
            _, logp, _, _, _ = agent.get_action_and_value(
                obs.reshape(-1, 84, 84), state, dones.reshape(-1), actions.reshape(-1)
            )
        return logp.reshape(steps, envs)

    full = logprobs(obs, dones, actions, initial)
    for env, starts in STARTS.items():
        one = (slice(None), slice(env, env + 1))
        state = (initial[0][:, env : env + 1], initial[1][:, env : env + 1])
        bounds = [0, *[s for s in starts if s > 0], T]
        for begin, end in zip(bounds[:-1], bounds[1:], strict=True):
            # Each episode's frames alone, from a zero state if it starts here, else from the carried-in state.
            fresh = begin in starts
            segment_state = (torch.zeros_like(state[0]), torch.zeros_like(state[1])) if fresh else state
            alone = logprobs(obs[begin:end][one], torch.zeros(end - begin, 1), actions[begin:end][one], segment_state)
            torch.testing.assert_close(full[begin:end, env], alone[:, 0], atol=1e-5, rtol=1e-5)
    # The state is really carried between the frames of one episode: env 2 from a zero state differs.
    zeroed = logprobs(obs, dones, actions, (torch.zeros_like(initial[0]), torch.zeros_like(initial[1])))
    assert (full[:, 2] - zeroed[:, 2]).abs().max() > 1e-3
    # ...and cut at a start: a different past before frame 5 of env 0 changes nothing from frame 5 on.
    other = obs.clone()
    other[:5, 0] = 255 - other[:5, 0]
    changed = logprobs(other, dones, actions, initial)
    assert (changed[:5, 0] - full[:5, 0]).abs().max() > 1e-3
    torch.testing.assert_close(changed[5:, 0], full[5:, 0], atol=1e-5, rtol=1e-5)


TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "eval/episodic_return",
}
TINY = ["--num-envs", "2", "--num-steps", "128", "--num-minibatches", "2", "--update-epochs", "1"]


def test_end_to_end_then_resume(workdir):
    flags = [*TINY, "--run-name", "lstm", "--checkpoint-frequency", "1", "--seed", "3"]
    proc = run_script(
        "ppo_atari_lstm.py", [*flags, "--total-timesteps", "512", "--save-model", "--eval-episodes", "1"], workdir
    )
    check_ok(proc)
    run_dir = only_run_dir(workdir)
    scalars = read_scalars(run_dir)
    assert TAGS <= set(scalars), f"missing tags: {TAGS - set(scalars)}"
    assert [s for s, _ in scalars["losses/value_loss"]] == [256, 512]  # two PPO updates
    saved = torch.load(run_dir / "ppo_atari_lstm.cleanrl_model", weights_only=True)
    assert saved["script"] == "ppo_atari_lstm" and saved["env_id"] == "BreakoutNoFrameskip-v4"
    agent = make_agent(load_script_module("ppo_atari_lstm.py"), hidden=saved["args"]["lstm_hidden_size"])
    agent.load_state_dict(saved["model_state_dict"])

    # A longer budget on the same run continues from its last checkpoint, logging no step twice.
    resumed = run_script("ppo_atari_lstm.py", [*flags, "--total-timesteps", "768", "--resume", "auto"], workdir)
    check_ok(resumed)
    assert "resumed from runs/lstm/checkpoints/ckpt_000000000512.pt" in resumed.stdout
    assert_continuous_log(run_dir, 256, 768)


BAD_INPUT = [
    (["--num-envs", "3", "--num-minibatches", "2"], "divisible"),
    (["--env-id", "NoSuchGameNoFrameskip-v4"], "unknown"),
]


@pytest.mark.parametrize("flags,needle", BAD_INPUT, ids=[" ".join(c[0]) for c in BAD_INPUT])
def test_bad_input_fails_cleanly(flags, needle, workdir):
    proc = run_script("ppo_atari_lstm.py", flags, workdir, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr
    assert not (workdir / "runs").exists() and not (workdir / "videos").exists()
