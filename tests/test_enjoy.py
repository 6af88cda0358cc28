"""Every script's saved model can be watched with `python -m cleanrl_utils.enjoy`; foreign models are refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import imageio
import pytest
import torch

from cleanrl_utils.procgen import procgen_unavailable_reason
from conftest import check_ok, only_run_dir, read_scalars, run_module, run_script

PROCGEN_UNAVAILABLE = procgen_unavailable_reason()

ATARI_PPO = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1",
             "--total-timesteps", "64"]  # fmt: skip
OFF_POLICY_ATARI = ["--learning-starts", "32", "--total-timesteps", "64", "--buffer-size", "1000"]
OFF_POLICY_CONTINUOUS = ["--env-id", "Pendulum-v1", "--learning-starts", "32", "--total-timesteps", "64",
                         "--hidden-size", "16", "--batch-size", "16"]  # fmt: skip
PROCGEN = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
           "--total-timesteps", "64"]  # fmt: skip
TINY = {
    "ppo.py": ["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "64"],
    "ppo_atari.py": ATARI_PPO,
    "ppo_atari_multigpu.py": ATARI_PPO,
    "ppo_continuous_action.py": [
        "--env-id",
        "Pendulum-v1",
        "--num-envs",
        "2",
        "--num-steps",
        "32",
        "--total-timesteps",
        "64",
    ],  # fmt: skip
    "dqn.py": ["--learning-starts", "32", "--total-timesteps", "64"],
    "c51.py": ["--learning-starts", "32", "--total-timesteps", "64"],
    "dqn_atari.py": OFF_POLICY_ATARI,
    "c51_atari.py": OFF_POLICY_ATARI,
    "ddpg_continuous_action.py": OFF_POLICY_CONTINUOUS,
    "td3_continuous_action.py": OFF_POLICY_CONTINUOUS,
    "sac_continuous_action.py": OFF_POLICY_CONTINUOUS,
    "sac_atari.py": OFF_POLICY_ATARI,
    "ppo_atari_lstm.py": [
        "--num-envs",
        "2",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--total-timesteps",
        "64",
    ],  # fmt: skip
    "ppo_procgen.py": PROCGEN,
    "ppg_procgen.py": [*PROCGEN, "--n-iteration", "1", "--e-auxiliary", "1", "--aux-minibatch-size", "64"],
}


def enjoy(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_module("enjoy", args, cwd)


def train_tiny(script: str, workdir: Path) -> Path:
    check_ok(run_script(script, [*TINY[script], "--save-model", "--eval-episodes", "1"], workdir))
    run_dir = only_run_dir(workdir)
    # The script evaluated its own model right after saving it.
    assert len(read_scalars(run_dir)["eval/episodic_return"]) == 1
    return run_dir / f"{script[:-3]}.cleanrl_model"


@pytest.mark.parametrize("script", sorted(TINY))
def test_enjoy_plays_the_saved_model(script, workdir):
    if "procgen" in script and PROCGEN_UNAVAILABLE:
        pytest.skip(f"procgen tests skipped: {PROCGEN_UNAVAILABLE}")
    model = train_tiny(script, workdir)
    proc = enjoy(["--exp-name", script[:-3], "--model-path", str(model), "--eval-episodes", "2"], workdir)
    check_ok(proc)
    episodes = [line for line in proc.stdout.splitlines() if line.startswith("episode=")]
    assert len(episodes) == 2, proc.stdout
    assert "mean return" in proc.stdout


def test_enjoy_refuses_a_model_of_another_script(workdir):
    model = train_tiny("dqn.py", workdir)
    proc = enjoy(["--exp-name", "ppo", "--model-path", str(model), "--eval-episodes", "1"], workdir)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "saved by dqn.py, not ppo.py" in lines[0], lines
    missing = enjoy(["--exp-name", "ppo", "--model-path", str(workdir / "nope.cleanrl_model")], workdir)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_enjoy_captures_a_playable_video(workdir):
    model = train_tiny("ppo.py", workdir)
    proc = enjoy(["--exp-name", "ppo", "--model-path", str(model), "--eval-episodes", "1", "--capture-video",
                  "--run-name", "watch"], workdir)  # fmt: skip
    check_ok(proc)
    videos = sorted((workdir / "videos" / "watch").glob("*.mp4"))
    assert videos, proc.stdout
    with imageio.get_reader(str(videos[0]), "ffmpeg") as reader:
        frames = [frame for frame in reader]
    length = int(proc.stdout.split("episodic_return=")[1].split(".")[0])  # CartPole: return == length
    assert abs(len(frames) - (length + 1)) <= 1  # the reset frame plus one per step
    assert frames[0].ndim == 3 and frames[0].shape[2] == 3


def test_saved_model_loads_without_pickled_code(workdir):
    model = train_tiny("ppo.py", workdir)
    saved = torch.load(model, weights_only=True)
    assert saved["script"] == "ppo" and saved["env_id"] == "CartPole-v1"
