"""benchmark/gpu_check.sh, rehearsed on the CPU: a lent GPU's few minutes must not be spent on a broken script."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, script_env

CHECK = REPO / "benchmark" / "gpu_check.sh"
STEPS = [
    "ppo_cpu",
    "ppo_atari_cpu",
    "ppo_continuous_cpu",
    "multigpu_1proc_cpu",
    "multigpu_1proc_cpu_ale_bf16",
    "multigpu_1proc_cpu_ale_bf16_groups2",
    "multigpu_1proc_cpu_ale_bf16_compile",
    "multigpu_gloo_2proc",
    "multigpu_gloo_2proc_shared_cpu",
]


def gpu_check(*args: str, timeout: float = 900, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CHECK), *args],
        env=script_env(PYTHON=sys.executable, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_rehearsal_passes_every_step_and_reads_back_their_sps():
    proc = gpu_check("--rehearse")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "REHEARSAL on the CPU" in out
    for step in STEPS:
        # Each training step passed and its SPS was read back from its TensorBoard file.
        assert re.search(rf"^PASS  {re.escape(step)}  SPS=\d+  wall=\d+s$", out, re.M), (step, out)
    assert re.search(r"^PASS  allreduce_vs_ddp \(gloo, 2 proc\)$", out, re.M), out
    assert "| DDP |" in out and "replicas identical" in out
    # The two-process steps report both ranks' final parameter checksums, which must agree.
    blocks = dict(re.findall(r"^PASS  (\S+)  SPS=.*\n((?:      .*\n)*)", out, re.M))
    for step in ("multigpu_gloo_2proc", "multigpu_gloo_2proc_shared_cpu"):
        sums = dict(re.findall(r"rank=(\d) done: .*param_sha256=([0-9a-f]+)", blocks[step]))
        assert sorted(sums) == ["0", "1"] and sums["0"] == sums["1"], (step, blocks[step])
    assert out.rstrip().endswith("gpu_check: 0 failure(s)"), out


def test_spent_budget_skips_the_training_steps_and_fails():
    proc = gpu_check("--rehearse", GPU_CHECK_BUDGET="0")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    for step in STEPS:
        assert f"FAIL  {step}  (skipped: the 0s budget is spent)" in out, out
    assert f"gpu_check: {len(STEPS)} failure(s)" in out, out


def test_unknown_argument_is_one_error_line():
    proc = gpu_check("--cpu", timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["error: unknown argument '--cpu' (the only option is --rehearse)"]
