"""Run under torchrun with 2+ gloo processes: checks all_reduce_gradients of ppo_atari_multigpu.py."""

import sys
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
print(f"rank {rank}: gradients averaged correctly", flush=True)
dist.destroy_process_group()
