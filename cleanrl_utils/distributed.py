"""Small helpers for scripts launched by torchrun (infrastructure, not algorithm)."""

from __future__ import annotations

import datetime
import os


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def omp_threads_set_by_user() -> bool:
    """Whether ``OMP_NUM_THREADS`` was exported by the user rather than injected by torchrun.

    torchrun sets ``OMP_NUM_THREADS=1`` for its workers when ``--nproc_per_node > 1`` and the
    variable is unset. It does so in its own process after start, so the environment it was
    *started* with (``/proc/<ppid>/environ`` on Linux) still tells whether the user set it.
    Where that cannot be read, the value is treated as the user's.
    """
    if "OMP_NUM_THREADS" not in os.environ:
        return False
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return True
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            launcher_env = f.read().split(b"\0")
    except OSError:
        return True
    return any(entry.startswith(b"OMP_NUM_THREADS=") for entry in launcher_env)


def torch_threads_per_process(local_world_size: int, requested: int = 0) -> tuple[int, str]:
    """The intra-op thread count for one of ``local_world_size`` processes on this machine.

    Rule: an explicit request (``--torch-threads``) wins, then an ``OMP_NUM_THREADS`` the user
    exported, else each process gets an equal share of the cores available to it
    (at least one). Returns the count and a short reason for the log.
    """
    if requested > 0:
        return requested, "--torch-threads"
    if omp_threads_set_by_user():
        try:
            return max(1, int(os.environ["OMP_NUM_THREADS"])), "OMP_NUM_THREADS"
        except ValueError:
            pass
    cores = available_cores()
    return max(1, cores // max(1, local_world_size)), f"{cores} cores / {local_world_size} local processes"


def init_process_group(backend: str, timeout: datetime.timedelta) -> None:
    """``torch.distributed.init_process_group`` that survives torchrun restarts of the worker group.

    Under torchrun the workers share the agent's TCPStore across restarts of the group. Seen here
    (torch 2.13, gloo, a loaded 2-core machine): after ``--max-restarts`` relaunched the group, a
    rank could read the address its peer had published in the *previous* attempt and fail with
    "connectFullMesh ... Connection refused" on every restart. Keys under a per-attempt prefix
    cannot be stale.
    """
    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend=backend, timeout=timeout)
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"cleanrl/attempt_{attempt}", store)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
