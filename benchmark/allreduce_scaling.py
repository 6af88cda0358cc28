"""all_reduce time against message size and process count (gloo on loopback), with a latency/bandwidth fit.

Run it under torchrun once per process count; each run appends its medians to a JSON file:

    for n in 2 4; do torchrun --standalone --nproc_per_node=$n benchmark/allreduce_scaling.py \\
        --json docs/benchmarks/allreduce_scaling.json; done

For every size (float32 elements, 1 KB to 64 MB) it times --reps all_reduce calls after a warm-up
and records the median. The fit is the ring all-reduce model t(bytes) = 2(p-1) * alpha + 2(p-1)/p *
bytes / beta (alpha: per-message latency, beta: bandwidth), least squares on all sizes. On one
machine the "network" is loopback through the kernel: these numbers are inputs for
benchmark/scaling_model.py, not a prediction of a real network (which the model states separately).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

SIZES = [2**k for k in range(8, 25, 2)]  # 256 .. 16M floats = 1 KB .. 64 MB
GRADIENT = 1_686_693  # floats in the Nature-CNN actor-critic's gradient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", default=None, help="append the results of this process count here")
    opts = parser.parse_args()
    if "RANK" not in os.environ:
        sys.exit(
            "error: run this under torchrun, e.g. torchrun --standalone --nproc_per_node=2 benchmark/allreduce_scaling.py"
        )
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for numel in [*SIZES, GRADIENT]:
        tensor = torch.ones(numel)
        for _ in range(3):
            dist.all_reduce(tensor)
        times = []
        for _ in range(opts.reps if numel < 2**22 else max(5, opts.reps // 3)):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        # The slowest rank decides when a collective is over.
        median = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
        results[numel] = median.item()
    if rank == 0:
        sizes = np.array(SIZES, dtype=np.float64) * 4
        t = np.array([results[n] for n in SIZES])
        # t = a * 2(p-1) + b * 2(p-1)/p * bytes, with a = alpha and b = 1/beta
        design = np.stack([np.full_like(sizes, 2 * (world - 1)), 2 * (world - 1) / world * sizes], axis=1)
        (alpha, inv_beta), *_ = np.linalg.lstsq(design, t, rcond=None)
        entry = {
            "processes": world,
            "times_s": {str(n * 4): results[n] for n in SIZES},
            "gradient_bytes": GRADIENT * 4,
            "gradient_time_s": results[GRADIENT],
            "alpha_s": float(alpha),
            "beta_bytes_per_s": float(1 / inv_beta) if inv_beta > 0 else float("inf"),
            "cpu_count": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
        }
        print(json.dumps(entry, indent=2))
        if opts.json:
            path = Path(opts.json)
            data = json.loads(path.read_text()) if path.exists() else []
            data = [d for d in data if d["processes"] != world] + [entry]
            path.write_text(json.dumps(sorted(data, key=lambda d: d["processes"]), indent=2) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
