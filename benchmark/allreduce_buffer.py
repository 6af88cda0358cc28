"""The gradient all_reduce of ppo_atari_multigpu.py: a new flat tensor per call, a reused one, shared memory.

    torchrun --standalone --nproc_per_node=2 benchmark/allreduce_buffer.py

Each process holds gradients of the Nature-CNN actor-critic's shapes (1,686,693 floats, 6.7 MB) and
averages them with the script's own all_reduce_gradients, --calls times per variant after a
barrier, interleaving the variants over --rounds rounds. Rank 0 prints the median wall time per call
and the minor page faults per call of its process. As in training, the gradients are new tensors
at every call (zero_grad sets them to None). The variants: gloo's all_reduce of a new flat tensor,
of the reused buffer, and the script's SharedMemorySum (the default on one CPU node) on that buffer.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import sys
import time
import types
from pathlib import Path

import gymnasium as gym
import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    if "RANK" not in os.environ:
        sys.exit(
            "error: run this under torchrun, e.g. torchrun --standalone --nproc_per_node=2 benchmark/allreduce_buffer.py"
        )
    spec = importlib.util.spec_from_file_location("ppo_atari_multigpu", REPO / "cleanrl" / "ppo_atari_multigpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    agent = module.Agent(types.SimpleNamespace(single_action_space=gym.spaces.Discrete(4)))
    params = list(agent.parameters())
    buffer = torch.empty(sum(p.numel() for p in params))
    shared = module.SharedMemorySum(buffer.numel(), buffer.dtype, dist.get_rank(), world)
    variants = {"new tensor per call": (None, None), "reused buffer": (buffer, None), "shared memory": (buffer, shared)}
    walls = {name: [] for name in variants}
    faults = {name: [] for name in variants}
    for _ in range(opts.rounds):
        for name, (reused, shared_sum) in variants.items():
            for _ in range(opts.calls):
                for p in params:
                    p.grad = torch.randn_like(p)
                dist.barrier()
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                module.all_reduce_gradients(params, world, reused, shared_sum)
                walls[name].append(time.perf_counter() - start)
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    if dist.get_rank() == 0:
        print(f"{world} processes, {buffer.numel():,} floats, medians of {opts.rounds * opts.calls} calls")
        for name in variants:
            print(f"{name}: {1000 * statistics.median(walls[name]):.2f} ms per call, "
                  f"{statistics.median(faults[name]):.0f} page faults per call")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
