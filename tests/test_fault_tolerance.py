"""ppo_atari_multigpu.py survives a killed worker (torchrun --max-restarts) and a lost node (elastic c10d)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from conftest import assert_continuous_log, free_port, only_run_dir, script_env, torchrun_command

SCRIPT = "ppo_atari_multigpu.py"


def worker_pids(log: Path) -> dict[tuple[int, int], int]:
    """{(rank, restart): pid} from the start lines the script prints."""
    text = log.read_text() if log.exists() else ""
    return {
        (int(m.group(1)), int(m.group(3))): int(m.group(2))
        for m in re.finditer(r"rank=(\d+) local_rank=\d+ world_size=\d+ pid=(\d+) restart=(\d+)", text)
    }


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def kill_tree(proc: subprocess.Popen, logs: list[Path]) -> None:
    """Stop a torchrun launch and its workers, whatever state they are in."""
    for pids in (worker_pids(log) for log in logs):
        for pid in pids.values():
            try:
                os.killpg(pid, signal.SIGKILL)  # torchrun starts each worker in its own session
            except (ProcessLookupError, PermissionError):
                pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


FLAGS = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1",
         "--checkpoint-frequency", "2", "--dist-timeout", "30"]  # fmt: skip


def test_kill_minus_9_one_worker_group_restarts_and_completes(workdir):
    total = 128 * 24
    log = workdir / "torchrun.log"
    cmd = torchrun_command(["--standalone", "--nproc_per_node=2", "--max-restarts=3"], SCRIPT,
                           [*FLAGS, "--total-timesteps", str(total)])  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=workdir, env=script_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: len(list(workdir.glob("runs/*/checkpoints/ckpt_*.pt"))) >= 2, 180, "two checkpoints")
        os.kill(worker_pids(log)[(1, 0)], signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        kill_tree(proc, [log])
    out = log.read_text()
    assert proc.returncode == 0, out[-4000:]
    # A restarted gloo group can fail its first connect on a loaded machine (torchrun then restarts
    # once more), so any later restart of rank 1 counts.
    restarts = [restart for (rank, restart) in worker_pids(log) if rank == 1]
    assert max(restarts) >= 1, f"the group was not restarted: {worker_pids(log)}\n{out[-6000:]}"
    assert "resumed from" in out
    run_dir = only_run_dir(workdir)  # the restarted group kept the same run folder
    assert_continuous_log(run_dir, 128, total)


def test_elastic_lost_node_finishes_on_the_other(workdir):
    total = 128 * 40
    port = free_port()
    launcher = ["--nnodes=1:2", "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=elastic-test", "--max-restarts=3", "--rdzv-conf=last_call_timeout=2"]  # fmt: skip
    procs, logs = [], []
    try:
        for node in (0, 1):
            cwd = workdir / f"node{node}"
            cwd.mkdir()
            logs.append(workdir / f"node{node}.log")
            procs.append(
                subprocess.Popen(
                    torchrun_command(launcher, SCRIPT, [*FLAGS, "--total-timesteps", str(total)]),
                    cwd=cwd,
                    env=script_env(),
                    stdout=logs[-1].open("w"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            )
            time.sleep(1)  # node 0 hosts the rendezvous store
        wait_for(lambda: len(list(workdir.glob("node0/runs/*/checkpoints/ckpt_*.pt"))) >= 2, 180, "checkpoints")
        # Node 1 is lost: its agent and its worker die at once.
        lost_worker = worker_pids(logs[1])
        os.killpg(procs[1].pid, signal.SIGKILL)
        for pid in lost_worker.values():
            os.killpg(pid, signal.SIGKILL)
        procs[0].wait(timeout=300)
    finally:
        for proc, log in zip(procs, logs, strict=False):
            kill_tree(proc, [log])
    out = logs[0].read_text()
    assert procs[0].returncode == 0, out[-4000:]
    assert re.search(r"rank=0 local_rank=0 world_size=1 pid=\d+ restart=[1-9]", out), "no restart with one node"
    assert "resumed from" in out
    assert_continuous_log(only_run_dir(workdir / "node0"), 128, total)
