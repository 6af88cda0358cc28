"""The checkpoint module, and checkpoint/resume of every script run the way users run them."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cleanrl_utils import checkpoint as ckpt
from cleanrl_utils import io as cio
from conftest import SCRIPTS, assert_continuous_log, check_ok, only_run_dir, read_scalars, run_script, script_env

# ---------------------------------------------------------------- module level


def state(step, script="ppo"):
    return {"script": script, "run_name": "r", "args": {}, "global_step": step, "iteration": step, "w": torch.ones(3)}


def test_save_keeps_newest_k_atomically(tmp_path):
    for step in (10, 20, 30, 40, 50):
        ckpt.save_checkpoint(state(step), str(tmp_path), keep=3)
    names = [Path(p).name for p in ckpt.list_checkpoints(str(tmp_path))]
    assert names == ["ckpt_000000000030.pt", "ckpt_000000000040.pt", "ckpt_000000000050.pt"]
    assert not [p for p in os.listdir(tmp_path / "checkpoints") if p.endswith(".part")]
    assert ckpt.latest_checkpoint(str(tmp_path), "ppo")["global_step"] == 50


def test_crash_while_writing_leaves_previous_checkpoint_loadable(tmp_path, monkeypatch):
    ckpt.save_checkpoint(state(10), str(tmp_path))

    def dies_half_way(obj, f):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full (simulated crash while writing)")

    monkeypatch.setattr(cio.torch, "save", dies_half_way)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(state(20), str(tmp_path))
    monkeypatch.undo()
    assert [Path(p).name for p in ckpt.list_checkpoints(str(tmp_path))] == ["ckpt_000000000010.pt"]
    assert os.listdir(tmp_path / "checkpoints") == ["ckpt_000000000010.pt"]  # no temporary file left
    assert ckpt.latest_checkpoint(str(tmp_path), "ppo")["global_step"] == 10


def test_process_killed_while_writing_leaves_previous_checkpoint(tmp_path):
    # A real process writes big checkpoints in a loop and is killed with SIGKILL part-way.
    ckpt.save_checkpoint(state(1), str(tmp_path))
    code = (
        "import sys, torch\n"
        "from cleanrl_utils.checkpoint import save_checkpoint\n"
        "big = torch.ones(40_000_000)\n"
        "for step in range(2, 1000):\n"
        "    save_checkpoint({'script': 'ppo', 'global_step': step, 'w': big}, sys.argv[1], keep=100)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=script_env())
    deadline = time.time() + 60
    while time.time() < deadline and not any(p.endswith(".part") for p in os.listdir(tmp_path / "checkpoints")):
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    for path in ckpt.list_checkpoints(str(tmp_path)):  # every file under its final name is whole
        ckpt.load_checkpoint(path, "ppo")
    assert ckpt.latest_checkpoint(str(tmp_path), "ppo") is not None


def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(tmp_path, capsys):
    ckpt.save_checkpoint(state(10), str(tmp_path))
    bad = tmp_path / "checkpoints" / "ckpt_000000000020.pt"
    good_bytes = (tmp_path / "checkpoints" / "ckpt_000000000010.pt").read_bytes()
    bad.write_bytes(good_bytes[: len(good_bytes) // 2])  # truncated
    latest = ckpt.latest_checkpoint(str(tmp_path), "ppo")
    assert latest["global_step"] == 10
    assert "skipping unusable checkpoint" in capsys.readouterr().err


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_pickled_code_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.pt"
    torch.save({"script": "ppo", "global_step": 1, "payload": RunsCode()}, evil)
    with pytest.raises(ckpt.CheckpointError, match="cannot be loaded safely"):
        ckpt.load_checkpoint(str(evil), "ppo")
    assert not (tmp_path / "PWNED").exists()


def test_checkpoint_from_another_script_is_refused(tmp_path):
    path = ckpt.save_checkpoint(state(5, script="ppo_atari"), str(tmp_path))
    with pytest.raises(ckpt.CheckpointError, match="written by ppo_atari.py, not by ppo.py"):
        ckpt.load_checkpoint(path, "ppo")


def test_rng_state_round_trip():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    saved = ckpt.rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.set_rng_state(saved)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


# ---------------------------------------------------------------- scripts

# script, flags (tiny budget, checkpoint every iteration), batch per iteration, total
RESUME_CASES = {
    "ppo.py": (["--num-envs", "4", "--num-steps", "128", "--total-timesteps", "40960"], 512, 40960),
    "ppo_atari.py": (
        [
            "--num-envs",
            "2",
            "--num-steps",
            "32",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--total-timesteps",
            "1280",
        ],
        64,
        1280,
    ),
    "ppo_atari_multigpu.py": (
        [
            "--local-num-envs",
            "2",
            "--num-steps",
            "32",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--total-timesteps",
            "1280",
        ],
        64,
        1280,
    ),
    "ppo_continuous_action.py": (
        [
            "--env-id",
            "Hopper-v5",
            "--num-envs",
            "2",
            "--num-steps",
            "64",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--total-timesteps",
            "3840",
        ],
        128,
        3840,
    ),
}


# SIGTERM for every script; SIGINT (Ctrl-C) once, on a script with subprocess envs.
SIGNAL_CASES = [(script, signal.SIGTERM) for script in sorted(RESUME_CASES)] + [("ppo_atari.py", signal.SIGINT)]


@pytest.mark.parametrize("script,sig", SIGNAL_CASES, ids=[f"{c[0]}-{c[1].name}" for c in SIGNAL_CASES])
def test_signal_checkpoints_then_resume_auto_finishes(script, sig, workdir):
    flags, batch, total = RESUME_CASES[script]
    common = [*flags, "--run-name", "myrun", "--checkpoint-frequency", "1"]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), *common],
        cwd=workdir,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    ckpt_dir = workdir / "runs" / "myrun" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and len(list(ckpt_dir.glob("ckpt_*.pt"))) < 2:
        time.sleep(0.05)
    # Like Ctrl-C or a scheduler: the signal goes to the whole process group (env workers included).
    os.killpg(proc.pid, sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == ckpt.EXIT_PREEMPTED, out[-3000:]
    assert "checkpoint" in out and "written" in out
    stopped_at = ckpt.latest_checkpoint(str(workdir / "runs" / "myrun"), script[:-3])["global_step"]
    assert 0 < stopped_at < total

    resumed = run_script(script, [*common, "--resume", "auto"], workdir)
    check_ok(resumed)
    assert f"resumed from runs/myrun/checkpoints/ckpt_{stopped_at:012d}.pt" in resumed.stdout
    assert only_run_dir(workdir).name == "myrun"
    assert_continuous_log(workdir / "runs" / "myrun", batch, total)


def test_resume_from_explicit_path_and_nothing_left_to_do(workdir):
    flags, batch, total = RESUME_CASES["ppo.py"]
    flags = [*flags[:-1], "2048", "--checkpoint-frequency", "2"]
    check_ok(run_script("ppo.py", [*flags, "--run-name", "a"], workdir))
    final = ckpt.latest_checkpoint(str(workdir / "runs" / "a"), "ppo")
    assert final["global_step"] == 2048
    # Resuming a finished run (e.g. a scheduler retry) trains nothing more and logs nothing twice.
    again = run_script("ppo.py", [*flags, "--resume", final["path"]], workdir)
    check_ok(again)
    assert_continuous_log(workdir / "runs" / "a", 512, 2048)


def test_determinism_same_seed_same_losses(workdir):
    flags = ["--num-envs", "4", "--num-steps", "128", "--total-timesteps", "2048", "--seed", "7"]
    losses = []
    for name in ("one", "two"):
        check_ok(run_script("ppo.py", [*flags, "--run-name", name], workdir))
        scalars = read_scalars(workdir / "runs" / name)
        losses.append([scalars[t] for t in ("losses/value_loss", "losses/policy_loss", "losses/approx_kl")])
    assert losses[0] == losses[1]


def test_non_finite_stops_and_keeps_last_good_checkpoint(workdir):
    base = ["--num-envs", "4", "--num-steps", "128", "--run-name", "n", "--checkpoint-frequency", "1"]
    check_ok(run_script("ppo.py", [*base, "--total-timesteps", "1024"], workdir))
    good = ckpt.latest_checkpoint(str(workdir / "runs" / "n"), "ppo")
    # Continue with an absurd learning rate: the parameters blow up in the next iteration.
    proc = run_script(
        "ppo.py", [*base, "--total-timesteps", "4096", "--learning-rate", "1e30", "--resume", "auto"], workdir
    )
    assert proc.returncode == ckpt.EXIT_NONFINITE, proc.stderr
    err = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "non-finite" in err[0] and Path(good["path"]).name in err[0]
    after = ckpt.latest_checkpoint(str(workdir / "runs" / "n"), "ppo")
    assert after["path"] == good["path"]  # nothing written after the blow-up
    assert all(torch.isfinite(t).all() for t in after["model"].values())


@pytest.mark.parametrize("script", sorted(RESUME_CASES))
def test_bad_resume_input(script, workdir):
    other = "ppo_atari" if script != "ppo_atari.py" else "ppo"
    foreign = ckpt.save_checkpoint(state(64, script=other), str(workdir / "elsewhere"))
    evil = workdir / "evil.pt"
    torch.save({"script": script[:-3], "global_step": 1, "payload": RunsCode()}, evil)
    cases = [
        (["--resume", str(workdir / "missing.pt")], "does not exist"),
        (["--resume", foreign], f"written by {other}.py"),
        (["--resume", str(evil)], "cannot be loaded safely"),
        (["--resume", "auto"], "needs --run-name"),
    ]
    for flags, needle in cases:
        proc = run_script(script, [*RESUME_CASES[script][0], *flags], workdir, timeout=120)
        assert proc.returncode == 2, (flags, proc.stdout[-2000:], proc.stderr[-2000:])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and needle in errors[0], (flags, proc.stderr)
        assert not (workdir / "runs").exists()
        assert not (workdir / "PWNED").exists()


@pytest.mark.parametrize("script,extra", [("dqn.py", []), ("c51.py", ["--checkpoint-buffer"])])
def test_value_based_sigterm_then_resume(script, extra, workdir):
    total = 30000
    common = ["--total-timesteps", str(total), "--learning-starts", "1000", "--run-name", "q",
              "--checkpoint-frequency", "1000", *extra]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), *common],
        cwd=workdir, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    ckpt_dir = workdir / "runs" / "q" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and len(list(ckpt_dir.glob("ckpt_*.pt"))) < 2:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == ckpt.EXIT_PREEMPTED, out[-3000:]
    stopped = ckpt.latest_checkpoint(str(workdir / "runs" / "q"), script[:-3])
    assert 0 < stopped["global_step"] < total and {"q_network", "target_network", "optimizer"} <= set(stopped)
    if extra:  # the replay buffer travels with the checkpoint
        # every step but the reset steps after episode ends (CartPole's early episodes are short)
        assert 0.8 * stopped["global_step"] < stopped["replay_buffer"]["size"] < stopped["global_step"]
    else:
        assert "replay_buffer" not in stopped

    resumed = run_script(script, [*common, "--resume", "auto"], workdir)
    check_ok(resumed)
    assert "resumed from" in resumed.stdout
    assert ckpt.latest_checkpoint(str(workdir / "runs" / "q"), script[:-3])["global_step"] == total
    steps = [s for s, _ in read_scalars(workdir / "runs" / "q")["charts/SPS"]]
    assert steps == sorted(set(steps)), "a step was logged twice"
