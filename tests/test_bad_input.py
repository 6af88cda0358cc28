"""Bad input: one clear line on stderr, exit status 2, and nothing written under runs/."""

from __future__ import annotations

import pytest

from conftest import run_script

CASES = [
    ("ppo.py", ["--env-id", "NoSuchEnv-v9"], "unknown"),
    ("ppo.py", ["--env-id", "Pendulum-v1"], "Discrete"),
    ("ppo.py", ["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "divisible"),
    ("ppo.py", ["--total-timesteps", "0"], "positive"),
    ("ppo.py", ["--total-timesteps", "-5"], "positive"),
    ("ppo_atari.py", ["--env-id", "NoSuchGameNoFrameskip-v4"], "unknown"),
    ("ppo_atari.py", ["--env-id", "CartPole-v1"], "Atari"),
    ("ppo_atari.py", ["--num-minibatches", "3"], "divisible"),
    ("ppo_atari.py", ["--total-timesteps", "0"], "positive"),
    ("ppo_atari.py", ["--env-groups", "3"], "--env-groups"),
    ("ppo_atari.py", ["--env-backend", "ale", "--capture-video"], "--env-backend gymnasium"),
    ("ppo_atari_multigpu.py", ["--env-id", "NoSuchGameNoFrameskip-v4"], "unknown"),
    ("ppo_atari_multigpu.py", ["--env-id", "CartPole-v1"], "Atari"),
    ("ppo_atari_multigpu.py", ["--num-minibatches", "3"], "divisible"),
    ("ppo_atari_multigpu.py", ["--total-timesteps", "0"], "positive"),
    ("ppo_atari_multigpu.py", ["--backend", "nccl", "--no-cuda"], "nccl"),
    ("ppo_atari_multigpu.py", ["--env-groups", "3"], "--env-groups"),
    ("ppo_atari_multigpu.py", ["--env-backend", "ale", "--capture-video"], "--env-backend gymnasium"),
    ("dqn.py", ["--env-id", "NoSuchEnv-v9"], "unknown"),
    ("dqn.py", ["--env-id", "Pendulum-v1"], "Discrete"),
    ("dqn.py", ["--total-timesteps", "0"], "positive"),
    ("c51.py", ["--v-min", "5", "--v-max", "-5"], "--v-min"),
    ("c51.py", ["--env-id", "Pendulum-v1"], "Discrete"),
    ("dqn_atari.py", ["--env-id", "CartPole-v1"], "Atari"),
    ("dqn_atari.py", ["--buffer-size", "100000000000"], "GiB"),
    ("c51_atari.py", ["--env-id", "NoSuchGameNoFrameskip-v4"], "unknown"),
    ("c51_atari.py", ["--n-atoms", "1"], "--n-atoms"),
    ("ppo_continuous_action.py", ["--env-id", "NoSuchEnv-v9"], "unknown"),
    ("ppo_continuous_action.py", ["--env-id", "CartPole-v1"], "Box"),
    ("ppo_continuous_action.py", ["--num-minibatches", "3"], "divisible"),
    ("ppo_continuous_action.py", ["--total-timesteps", "-1"], "positive"),
    ("ddpg_continuous_action.py", ["--env-id", "NoSuchEnv-v9"], "unknown"),
    ("ddpg_continuous_action.py", ["--env-id", "CartPole-v1"], "Box"),
    ("td3_continuous_action.py", ["--env-id", "CartPole-v1"], "Box"),
    ("td3_continuous_action.py", ["--noise-clip", "-1"], "--noise-clip"),
    ("td3_continuous_action.py", ["--policy-frequency", "0"], "positive"),
    ("sac_continuous_action.py", ["--env-id", "CartPole-v1"], "Box"),
    ("sac_continuous_action.py", ["--tau", "0"], "--tau"),
    ("sac_continuous_action.py", ["--total-timesteps", "0"], "positive"),
    ("sac_atari.py", ["--env-id", "Pendulum-v1"], "Atari"),
    ("sac_atari.py", ["--target-entropy-scale", "1.5"], "--target-entropy-scale"),
    ("sac_atari.py", ["--buffer-size", "100000000000"], "GiB"),
]


@pytest.mark.parametrize("script,flags,needle", CASES, ids=[f"{c[0]}:{' '.join(c[1])}" for c in CASES])
def test_bad_input_fails_cleanly(script, flags, needle, workdir):
    proc = run_script(script, flags, workdir, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and needle in lines[0], lines[0]
    assert not (workdir / "runs").exists()
    assert not (workdir / "videos").exists()
    assert not (workdir / "wandb").exists()
