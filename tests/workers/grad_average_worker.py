"""Run under torchrun with 2+ gloo processes: checks all_reduce_gradients and SharedMemorySum of ppo_atari_multigpu.py."""

import errno
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import load_script_module  # noqa: E402

module = load_script_module("ppo_atari_multigpu.py")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
unused = torch.nn.Parameter(torch.zeros(5))  # a parameter without a gradient is skipped
params = [*net.parameters(), unused]
buffer = torch.full((100,), float("nan"))  # longer than the 26 gradient values: only its start is used
for reused in (None, buffer, buffer):
    # Different local gradients on each rank: rank r holds (r + 1) * base + r.
    for i, p in enumerate(net.parameters()):
        base = torch.arange(p.numel(), dtype=torch.float32).view_as(p) + i
        p.grad = (rank + 1) * base + rank
    module.all_reduce_gradients(params, world, reused)
    for i, p in enumerate(net.parameters()):
        base = torch.arange(p.numel(), dtype=torch.float32).view_as(p) + i
        expected = sum((r + 1) * base + r for r in range(world)) / world
        torch.testing.assert_close(p.grad, expected)
    assert unused.grad is None
assert torch.isfinite(buffer[:26]).all() and torch.isnan(buffer[26:]).all()  # the buffer held the flat gradient

# The shared-memory sum gives the gradients all_reduce gives: bitwise for 2 processes (a + b is
# a + b in either order), and the same bits on every rank for any number of processes.
shared = module.SharedMemorySum(100, torch.float32, rank, world)
dist.barrier()  # rank 0 unlinks it after the constructor's barrier
assert not os.path.exists(shared.path), "the shared file is unlinked once every process has mapped it"
generator = torch.Generator().manual_seed(rank)
for call in range(6):
    grads = [torch.randn(p.shape, generator=generator) for p in net.parameters()]
    for p, g in zip(net.parameters(), grads, strict=True):
        p.grad = g.clone()
    module.all_reduce_gradients(params, world, buffer, shared)
    via_shared = [p.grad.clone() for p in net.parameters()]
    for p, g in zip(net.parameters(), grads, strict=True):
        p.grad = g.clone()
    module.all_reduce_gradients(params, world, buffer)
    for a, b in zip(via_shared, (p.grad for p in net.parameters()), strict=True):
        if world == 2:
            assert torch.equal(a, b), (call, a, b)
        else:
            torch.testing.assert_close(a, b)
    gathered = [torch.empty(26) for _ in range(world)]
    dist.all_gather(gathered, torch.cat([g.reshape(-1) for g in via_shared]))
    assert all(torch.equal(gathered[0], g) for g in gathered), "every rank must hold the same bits"


# A slow reader: rank 1 waits after every sum's wait, before reading the rows, while rank 0 goes on
# to write its next rows. The alternating sets of rows keep rank 1's reads intact.
class SlowAfterWait:
    def __getattr__(self, name):
        return getattr(dist, name)

    def all_reduce(self, tensor, *args, **kwargs):
        dist.all_reduce(tensor, *args, **kwargs)
        if rank == 1 and tensor is shared.ready:
            time.sleep(0.05)


module.dist = SlowAfterWait()
for call in range(8):
    flat = torch.full((100,), float(call * 10 + rank))
    shared.sum_(flat)
    assert torch.all(flat == sum(call * 10 + r for r in range(world))), (rank, call, flat[:3])
module.dist = dist

# No room for the shared array (a full /dev/shm): every rank raises SharedMemoryUnavailable with
# rank 0's reason, at once rather than with SIGBUS at the first write, and no file is left behind.
real_fallocate = os.posix_fallocate


def no_space(fd, offset, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


os.posix_fallocate = no_space
try:
    module.SharedMemorySum(100, torch.float32, rank, world)
    raise AssertionError("SharedMemorySum was made without room for it")
except module.SharedMemoryUnavailable as e:
    assert "cannot reserve" in str(e) and os.strerror(errno.ENOSPC) in str(e), str(e)
finally:
    os.posix_fallocate = real_fallocate
folder = os.path.dirname(shared.path)
pids = [None] * world
dist.all_gather_object(pids, os.getpid())
assert not [f for f in os.listdir(folder) if f.startswith(f"cleanrl-grads-{pids[0]}-")], "a file was left behind"
print(f"rank {rank}: shared-memory sums correct", flush=True)
print(f"rank {rank}: gradients averaged correctly", flush=True)
dist.destroy_process_group()
