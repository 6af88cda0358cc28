"""procgen: the gymnasium adapter, and ppo_procgen.py / ppg_procgen.py run the way users run them.

Where procgen cannot be installed, the tests that need it are skipped with the reason (shown by
``pytest -rs``); the bad-input cases that fail before procgen is touched run everywhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types

import gymnasium as gym
import numpy as np
import pytest
import torch

from cleanrl_utils import checkpoint as ckpt
from cleanrl_utils.procgen import game_name, procgen_unavailable_reason
from conftest import (
    SCRIPTS,
    assert_continuous_log,
    check_ok,
    load_script_module,
    only_run_dir,
    read_scalars,
    run_script,
    script_env,
)

UNAVAILABLE = procgen_unavailable_reason()
needs_procgen = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"procgen tests skipped: {UNAVAILABLE}")

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
AUX_TAGS = {"losses/aux/kl_loss", "losses/aux/aux_value_loss", "losses/aux/real_value_loss"}

# 4 envs x 32 steps: two PPO updates, and for PPG one whole cycle (2 policy iterations, then the aux phase).
TINY = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
PPG_TINY = [*TINY, "--n-iteration", "2", "--e-auxiliary", "2", "--aux-minibatch-size", "64"]


def test_game_names_researchers_type():
    for env_id in ("starpilot", "StarPilot", "StarPilot-v0", "procgen-starpilot-v0", "procgen:procgen-starpilot-v0"):
        assert game_name(env_id) == "starpilot", env_id
    assert game_name("starpilot-v5") is None and game_name("CartPole-v1") is None


@needs_procgen
def test_adapter_is_a_gymnasium_vector_env_with_episode_statistics():
    from cleanrl_utils.procgen import make_procgen_env

    envs = make_procgen_env("StarPilot-v0", 3, seed=5)
    assert envs.single_observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert envs.single_action_space == gym.spaces.Discrete(15) and envs.num_envs == 3
    obs, _ = envs.reset(seed=5)
    assert obs.shape == (3, 64, 64, 3) and obs.dtype == np.uint8
    rng = np.random.default_rng(0)
    steps, lengths, running = 0, [], np.zeros(3)
    for _ in range(400):
        obs, reward, terminated, truncated, infos = envs.step(rng.integers(0, 15, 3))
        assert obs.shape == (3, 64, 64, 3) and not truncated.any()
        steps, running = steps + 3, running + reward
        if "episode" in infos:
            assert (infos["_episode"] == terminated).all()  # statistics for exactly the envs that finished
            # Same-step autoreset: the step that ends an episode counts towards it.
            assert infos["episode"]["r"][terminated] == pytest.approx(running[terminated])
            lengths += infos["episode"]["l"][terminated].tolist()
            running[terminated] = 0.0
    envs.close()
    # Every step belongs to an episode: finished ones plus the unfinished tails cover all steps.
    assert len(lengths) > 3
    assert 0 <= steps - sum(lengths) <= 3 * max(lengths)


@needs_procgen
def test_adapter_seed_makes_levels_reproducible():
    from cleanrl_utils.procgen import make_procgen_env

    firsts = []
    for _ in range(2):
        envs = make_procgen_env("coinrun", 2, seed=11)
        obs, _ = envs.reset(seed=11)
        firsts.append(obs)
        envs.close()
    assert (firsts[0] == firsts[1]).all()


def spaces():
    return types.SimpleNamespace(
        single_observation_space=gym.spaces.Box(0, 255, (64, 64, 3), np.uint8),
        single_action_space=gym.spaces.Discrete(15),
    )


@needs_procgen
@pytest.mark.parametrize("script", ["ppo_procgen.py", "ppg_procgen.py"])
def test_end_to_end(script, workdir):
    flags = [*(PPG_TINY if script == "ppg_procgen.py" else TINY), "--total-timesteps", "256"]
    proc = run_script(
        script, [*flags, "--save-model", "--eval-episodes", "2", "--seed", "3", "--env-id", "StarPilot-v0"], workdir
    )
    check_ok(proc)
    run_dir = only_run_dir(workdir)
    exp_name = script[: -len(".py")]
    assert run_dir.name.startswith(f"StarPilot-v0__{exp_name}__3__")

    scalars = read_scalars(run_dir)
    expected = PPO_TAGS | {"eval/episodic_return"} | (AUX_TAGS if script == "ppg_procgen.py" else set())
    assert expected <= set(scalars), f"missing tags: {expected - set(scalars)}"
    assert [s for s, _ in scalars["losses/value_loss"]] == [128, 256]  # two PPO updates
    assert len(scalars["eval/episodic_return"]) == 2
    if script == "ppg_procgen.py":
        for tag in AUX_TAGS:  # one auxiliary phase, after the two policy iterations
            assert [s for s, _ in scalars[tag]] == [256], tag
            assert np.isfinite(scalars[tag][0][1])

    saved = torch.load(run_dir / f"{exp_name}.cleanrl_model", weights_only=True)
    assert saved["script"] == exp_name and saved["env_id"] == "StarPilot-v0"
    agent = load_script_module(script).Agent(spaces())
    agent.load_state_dict(saved["model_state_dict"])
    assert saved["return_rms"]["count"] > 256 - 1  # rewards were normalised with the statistics saved


@needs_procgen
def test_ppg_sigterm_mid_phase_then_resume_redoes_the_phase(workdir):
    # 2 phases of 256 steps, stopped during phase 2: the checkpoint is the phase boundary at step 256
    # (not the middle of phase 2, whose auxiliary buffer is not saved), and the resumed run redoes phase 2.
    common = [*PPG_TINY, "--total-timesteps", "512", "--run-name", "p", "--checkpoint-frequency", "1"]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "ppg_procgen.py"), *common],
        cwd=workdir, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    ckpt_dir = workdir / "runs" / "p" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not list(ckpt_dir.glob("ckpt_*.pt")):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == ckpt.EXIT_PREEMPTED, out[-3000:]
    stopped = ckpt.latest_checkpoint(str(workdir / "runs" / "p"), "ppg_procgen")
    assert (stopped["global_step"], stopped["phase"]) == (256, 1)

    resumed = run_script("ppg_procgen.py", [*common, "--resume", "auto"], workdir)
    check_ok(resumed)
    assert f"resumed from runs/p/checkpoints/ckpt_{stopped['global_step']:012d}.pt" in resumed.stdout
    assert_continuous_log(workdir / "runs" / "p", 128, 512)
    assert [s for s, _ in read_scalars(workdir / "runs" / "p")["losses/aux/kl_loss"]] == [256, 512]


BAD_INPUT = [
    ("ppo_procgen.py", ["--env-id", "starfighter"], "unknown procgen environment"),
    ("ppo_procgen.py", ["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "divisible"),
    ("ppg_procgen.py", ["--env-id", "BreakoutNoFrameskip-v4"], "unknown procgen environment"),
    ("ppg_procgen.py", ["--aux-minibatch-size", "1000"], "--aux-minibatch-size"),
    ("ppg_procgen.py", ["--total-timesteps", "100000"], "less than one PPG phase"),
]


@pytest.mark.parametrize("script,flags,needle", BAD_INPUT, ids=[f"{c[0]}:{' '.join(c[1])}" for c in BAD_INPUT])
def test_bad_input_fails_cleanly(script, flags, needle, workdir):
    proc = run_script(script, flags, workdir, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and needle in lines[0], lines[0]
    assert not (workdir / "runs").exists() and not (workdir / "videos").exists()
