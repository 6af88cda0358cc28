"""End-to-end runs of the PPO family with tiny budgets, asserting on what each run produced."""

from __future__ import annotations

import re
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import check_ok, load_script_module, only_run_dir, read_scalars, read_text_tags, run_script

PPO_TAGS = {
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
}

# script, env id, flags giving a tiny budget with several updates, number of updates, num_envs
CASES = {
    "ppo.py": (
        "CartPole-v1",
        [
            "--num-envs",
            "4",
            "--num-steps",
            "128",
            "--num-minibatches",
            "4",
            "--update-epochs",
            "2",
            "--total-timesteps",
            "2048",
        ],
        4,
        4,
    ),
    "ppo_atari.py": (
        "BreakoutNoFrameskip-v4",
        [
            "--num-envs",
            "2",
            "--num-steps",
            "128",
            "--num-minibatches",
            "4",
            "--update-epochs",
            "1",
            "--total-timesteps",
            "1024",
        ],
        4,
        2,
    ),
    # Plain `python` launch: one process, no process group.
    "ppo_atari_multigpu.py": (
        "BreakoutNoFrameskip-v4",
        [
            "--local-num-envs",
            "2",
            "--num-steps",
            "128",
            "--num-minibatches",
            "4",
            "--update-epochs",
            "1",
            "--total-timesteps",
            "1024",
        ],
        4,
        2,
    ),
    # Hopper (MuJoCo, like the default HalfCheetah) ends random episodes within tens of steps.
    "ppo_continuous_action.py": (
        "Hopper-v5",
        [
            "--env-id",
            "Hopper-v5",
            "--num-envs",
            "2",
            "--num-steps",
            "64",
            "--num-minibatches",
            "4",
            "--update-epochs",
            "2",
            "--total-timesteps",
            "256",
            "--async-envs",
        ],
        2,
        2,
    ),
}


def mp4_frame_count(path: Path) -> int:
    import imageio

    with imageio.get_reader(str(path), "ffmpeg") as reader:
        return sum(1 for _ in reader)


@pytest.mark.parametrize("script", sorted(CASES))
def test_end_to_end(script, workdir):
    env_id, flags, updates, num_envs = CASES[script]
    total = int(flags[flags.index("--total-timesteps") + 1])
    proc = run_script(script, [*flags, "--save-model", "--capture-video", "--seed", "3"], workdir)
    check_ok(proc)

    run_dir = only_run_dir(workdir)
    exp_name = script[: -len(".py")]
    assert re.fullmatch(rf"{re.escape(env_id)}__{exp_name}__3__\d+", run_dir.name)

    scalars = read_scalars(run_dir)
    assert PPO_TAGS <= set(scalars), f"missing tags: {PPO_TAGS - set(scalars)}"
    assert len(scalars["losses/value_loss"]) == updates
    assert scalars["charts/SPS"][-1][0] == total  # global_step counts every env
    assert "hyperparameters/text_summary" in read_text_tags(run_dir)
    # Episode statistics come from every env, not only env 0: the finished episodes cover all
    # steps except the unfinished tail of each env (CartPole's random-ish episodes are short).
    if script == "ppo.py":
        lengths = [v for _, v in scalars["charts/episodic_length"]]
        assert sum(lengths) >= total - num_envs * 150, (sum(lengths), total)

    # The saved model loads (weights_only) into the script's own network.
    model_file = run_dir / f"{exp_name}.cleanrl_model"
    saved = torch.load(model_file, weights_only=True)
    assert saved["script"] == exp_name and saved["env_id"] == env_id
    module = load_script_module(script)
    atari = script.startswith("ppo_atari")
    probe_env = None if atari else gym.make(env_id)
    if atari:
        spaces = types.SimpleNamespace(
            single_observation_space=gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
            single_action_space=gym.spaces.Discrete(4),
        )
    else:
        spaces = types.SimpleNamespace(
            single_observation_space=probe_env.observation_space, single_action_space=probe_env.action_space
        )
        probe_env.close()
    agent = module.Agent(spaces)
    agent.load_state_dict(saved["model_state_dict"])
    if script == "ppo_continuous_action.py":
        assert saved["obs_rms"]["mean"].shape == spaces.single_observation_space.shape
        assert saved["obs_rms"]["count"] > total - 1

    videos = list((workdir / "videos" / run_dir.name).glob("*.mp4"))
    assert videos, "no video written"
    assert mp4_frame_count(videos[0]) > 0
