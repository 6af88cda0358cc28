"""A model of ppo_atari_multigpu.py's SPS on 1-8 nodes x 1-8 GPUs, from rates measured on this machine.

    python benchmark/scaling_model.py --allreduce docs/benchmarks/allreduce_scaling.json \\
        --env-per-core 770 --update-per-core 1300 --out docs/benchmarks/scaling.md

One PPO iteration of one process, with b = envs x steps samples, M minibatches and K epochs:

    t_iter = b / env_rate + b / inference_rate + K * b / update_rate + K * M * t_allreduce(p)

and SPS = p * b / t_iter for p processes in all. Everything but t_allreduce is per process and
independent of p (each process steps its own envs and updates its own share of the global
minibatch); t_allreduce is the ring all-reduce of the 6.7 MB gradient over p processes,
2(p-1) * alpha + 2(p-1)/p * bytes / beta, with the slowest link's alpha and beta: NVLink inside a
node, the network between nodes. The measured inputs are per-core env and update rates of this
CPU (benchmark/throughput.py) and gloo's loopback all-reduce (benchmark/allreduce_scaling.py);
GPU update rates and the network figures are assumptions, stated in the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

GRADIENT_BYTES = 1_686_693 * 4
# name -> (alpha seconds per message hop, beta bytes/s achieved by a ring all-reduce)
NETWORKS = {
    "12.5 Gb/s Ethernet (c5.12xlarge), TCP": (50e-6, 12.5e9 / 8 * 0.8),
    "25 Gb/s Ethernet, TCP": (40e-6, 25e9 / 8 * 0.8),
    "100 Gb/s Ethernet, TCP": (30e-6, 100e9 / 8 * 0.7),
    "InfiniBand HDR 200 Gb/s, RDMA": (5e-6, 200e9 / 8 * 0.9),
}
NVLINK = (5e-6, 150e9)  # intra-node GPU-GPU for NCCL all-reduce, per direction (A100/H100 class, conservative)


def allreduce_time(p: int, alpha: float, beta: float, nbytes: float = GRADIENT_BYTES) -> float:
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta


def t_allreduce(nodes: int, gpus: int, network) -> float:
    p = nodes * gpus
    if nodes == 1:
        return allreduce_time(p, *NVLINK)
    # A ring through every GPU crosses the network between nodes; that link sets the pace.
    return allreduce_time(p, *network)


def sps(p: int, batch: int, env_rate: float, infer_rate: float, update_rate: float, t_ar: float, m=4, k=4):
    t_iter = batch / env_rate + batch / infer_rate + k * batch / update_rate + k * m * t_ar
    return p * batch / t_iter, k * m * t_ar / t_iter


def min_batch_for_comm(env_rate, infer_rate, update_rate, t_ar, m=4, k=4, share=0.10):
    """Smallest per-process batch b with communication <= share of the iteration."""
    per_sample = 1 / env_rate + 1 / infer_rate + k / update_rate
    comm = k * m * t_ar
    # comm <= share * (b * per_sample + comm)  <=>  b >= comm * (1 - share) / (share * per_sample)
    return math.ceil(comm * (1 - share) / (share * per_sample)) if comm > 0 else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allreduce", default="docs/benchmarks/allreduce_scaling.json")
    parser.add_argument("--env-per-core", type=float, required=True, help="measured Atari env steps/s per core")
    parser.add_argument("--vector-env-per-core", type=float, default=2800.0,
                        help="steps/s per core of a C++ vector env: --env-backend ale (ale_py), or envpool")  # fmt: skip
    parser.add_argument("--update-per-core", type=float, required=True, help="measured update samples/s per core")
    parser.add_argument("--infer-per-core", type=float, default=None, help="measured inference env steps/s per core")
    parser.add_argument("--gpu-update", type=float, default=40000.0, help="assumed update samples/s per GPU")
    parser.add_argument("--gpu-infer", type=float, default=200000.0, help="assumed inference env steps/s per GPU")
    parser.add_argument("--cores-per-gpu", type=int, default=6, help="CPU cores stepping the envs of each GPU")
    parser.add_argument("--cpu-node-cores", type=int, default=24, help="physical cores of a CPU-only node")
    parser.add_argument("--batch", type=int, default=1024, help="samples per process per iteration (envs x steps)")
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    infer_core = opts.infer_per_core or 10 * opts.update_per_core
    measured = json.loads(Path(opts.allreduce).read_text()) if Path(opts.allreduce).exists() else []

    out = ["# Scaling past this machine: a model of SPS for 1-8 nodes x 1-8 GPUs\n"]
    out.append(
        f"Computed {time.strftime('%Y-%m-%d')} by `benchmark/scaling_model.py` (its docstring gives the model):\n\n"
        f"```bash\npython benchmark/scaling_model.py {' '.join(sys.argv[1:])}\n```\n"
    )
    out.append("## Measured inputs (this machine: 2 CPU cores, no GPU)\n")
    if measured:
        out.append("gloo all_reduce on loopback, median time per call (`benchmark/allreduce_scaling.py`):\n")
        sizes = list(measured[0]["times_s"])
        heads = [f"{d['processes']} processes" + (" (more than cores)" if d["processes"] > d["cpu_count"] else "")
                 for d in measured]  # fmt: skip
        out.append("| bytes | " + " | ".join(heads) + " |")
        out.append("|---|" + "---|" * len(measured))
        for size in sizes:
            row = " | ".join(f"{d['times_s'][size] * 1e3:.3f} ms" for d in measured)
            out.append(f"| {int(size):,} | {row} |")
        grad = " | ".join(f"{d['gradient_time_s'] * 1e3:.2f} ms" for d in measured)
        out.append(f"| **{GRADIENT_BYTES:,} (the gradient)** | {grad} |")
        fits = "; ".join(
            f"{d['processes']} processes: alpha = {d['alpha_s'] * 1e6:.0f} us, beta = {d['beta_bytes_per_s'] / 1e9:.2f} GB/s"
            for d in measured
        )
        out.append(f"\nRing-model fit: {fits}. Loopback gloo copies through the kernel on 2 shared cores, so beta here")
        out.append("is a property of this box, not of a network; the model below uses the stated network figures.\n")
    out.append(f"- Atari env steps/s per core (subprocess workers, Breakout, Atari wrappers): {opts.env_per_core:.0f}")
    out.append(f"- PPO update samples/s per core (Nature CNN, bf16 + channels_last): {opts.update_per_core:.0f}")
    out.append(f"- Atari env steps/s per core, C++ vector env (`--env-backend ale`): {opts.vector_env_per_core:.0f}")
    out.append(f"- inference env steps/s per core: {infer_core:.0f}\n")
    out.append("(Each is a rate of docs/benchmarks/throughput.md, measured with both cores, divided by 2.)\n")

    out.append("## Assumptions\n")
    out.append(f"- GPU nodes: one process per GPU; each GPU's envs run on {opts.cores_per_gpu} CPU cores "
               f"({opts.cores_per_gpu * opts.env_per_core:.0f} steps/s with subprocess envs, "
               f"{opts.cores_per_gpu * opts.vector_env_per_core:.0f} with the C++ vector env at {opts.vector_env_per_core:.0f}/core); "
               f"a GPU updates {opts.gpu_update:.0f} samples/s and acts for {opts.gpu_infer:.0f} env steps/s "
               "(Nature CNN, bf16; not measured here).")  # fmt: skip
    out.append(f"- Per process and iteration: {opts.batch} samples (e.g. 8 envs x 128 steps), 4 minibatches, 4 epochs: "
               "16 all-reduces of the 6.7 MB gradient.")  # fmt: skip
    out.append("- All-reduce: ring over all processes; inside one node NVLink "
               f"(alpha {NVLINK[0] * 1e6:.0f} us, {NVLINK[1] / 1e9:.0f} GB/s), between nodes the network:")  # fmt: skip
    for name, (alpha, beta) in NETWORKS.items():
        out.append(f"  - {name}: alpha {alpha * 1e6:.0f} us, effective {beta / 1e9:.2f} GB/s")
    out.append("")

    env_gpu = opts.cores_per_gpu * opts.env_per_core
    for cpp_env in (False, True):
        env_rate = opts.cores_per_gpu * opts.vector_env_per_core if cpp_env else env_gpu
        label = "C++ vector env (--env-backend ale)" if cpp_env else "subprocess envs"
        for net_name, network in NETWORKS.items():
            if net_name.startswith("12.5"):
                continue
            out.append(f"## GPU nodes, {label}, {net_name}: SPS (communication share)\n")
            out.append("| nodes \\ GPUs per node | 1 | 2 | 4 | 8 |")
            out.append("|---|---|---|---|---|")
            for nodes in (1, 2, 4, 8):
                cells = []
                for gpus in (1, 2, 4, 8):
                    t_ar = t_allreduce(nodes, gpus, network)
                    rate, share = sps(nodes * gpus, opts.batch, env_rate, opts.gpu_infer, opts.gpu_update, t_ar)
                    cells.append(f"{rate / 1000:.1f}k ({share:.0%})")
                out.append(f"| {nodes} | " + " | ".join(cells) + " |")
            t_ar8 = t_allreduce(8, 8, network)
            b_min = min_batch_for_comm(env_rate, opts.gpu_infer, opts.gpu_update, t_ar8)
            out.append(f"\nCommunication stays under 10% at 8 x 8 with at least {b_min:,} samples per process per "
                       f"iteration (global batch {64 * b_min:,}).\n")  # fmt: skip

    out.append("## CPU-only nodes (the article's c5.12xlarge: 24 cores, 12.5 Gb/s)\n")
    cpu_net = NETWORKS["12.5 Gb/s Ethernet (c5.12xlarge), TCP"]
    out.append("One process per node using all its cores for envs, inference and the update (gloo between nodes):\n")
    out.append("| nodes | SPS | communication share |")
    out.append("|---|---|---|")
    cores = opts.cpu_node_cores
    node_env, node_infer, node_update = cores * opts.env_per_core, cores * infer_core, cores * opts.update_per_core
    batch_cpu = opts.batch * cores // 4
    cpu_results = {}
    for nodes in (1, 2, 4, 8):
        t_ar = allreduce_time(nodes, *cpu_net)
        # On one node the cores take turns: stepping, acting and updating do not overlap.
        per_sample = 1 / node_env + 1 / node_infer + 4 / node_update
        t_iter = batch_cpu * per_sample + 16 * t_ar
        cpu_results[nodes] = nodes * batch_cpu / t_iter
        out.append(f"| {nodes} | {cpu_results[nodes] / 1000:.1f}k | {16 * t_ar / t_iter:.1%} |")
    out.append(f"\n(batch {batch_cpu:,} samples per node per iteration.)\n")

    gpu8 = {}
    for cpp_env in (False, True):
        env_rate = opts.cores_per_gpu * (opts.vector_env_per_core if cpp_env else opts.env_per_core)
        for gpus in (1, 8):
            t_ar = t_allreduce(8, gpus, NETWORKS["25 Gb/s Ethernet, TCP"])
            gpu8[(cpp_env, gpus)] = sps(8 * gpus, opts.batch, env_rate, opts.gpu_infer, opts.gpu_update, t_ar)[0]
    out.append("## The article's claim: more than 100k environment steps/s on 8 nodes\n")
    verdict_cpu = "supports" if cpu_results[8] > 1e5 else "does not support"
    out.append(
        f"- 8 CPU-only c5.12xlarge nodes: the model gives {cpu_results[8] / 1000:.0f}k steps/s, so it {verdict_cpu} "
        "the claim there: "
        + (
            "on CPUs the PPO update (4 epochs over every sample) costs more than the emulator"
            if 4 / opts.update_per_core > 1 / opts.env_per_core
            else "on CPUs the emulator costs more than the PPO update"
        )
        + f", and the network takes {16 * allreduce_time(8, *cpu_net) / (batch_cpu * per_sample + 16 * allreduce_time(8, *cpu_net)):.0%} of an iteration."
    )
    settings = {
        (False, 1): "1 GPU per node, subprocess envs",
        (False, 8): "8 GPUs per node, subprocess envs",
        (True, 1): "1 GPU per node, C++ vector env",
        (True, 8): "8 GPUs per node, C++ vector env",
    }
    above = [f"{settings[key]} ({value / 1000:.0f}k)" for key, value in gpu8.items() if value > 1e5]
    below = [f"{settings[key]} ({value / 1000:.0f}k)" for key, value in gpu8.items() if value <= 1e5]
    out.append(
        f"- 8 GPU nodes over 25 Gb/s Ethernet ({opts.cores_per_gpu} CPU cores stepping each GPU's envs): the model "
        f"supports the claim with {'; '.join(above) or 'none of the settings'}, and not with "
        f"{'; '.join(below) or 'none'}. Where it holds, the emulators on the CPU cores and the GPU update set the "
        "pace and the 16 gradient all-reduces per iteration stay a small share (tables above)."
    )
    text = "\n".join(out) + "\n"
    print(text)
    if opts.out:
        Path(opts.out).write_text(text)


if __name__ == "__main__":
    main()
