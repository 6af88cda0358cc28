"""Turn a scheduler's environment into a torchrun invocation, then exec torchrun.

    python -m cleanrl_utils.launch -- cleanrl/ppo_atari_multigpu.py --num-envs 16
    python -m cleanrl_utils.launch --nproc-per-node 2 --max-restarts 3 -- cleanrl/ppo.py --env-id CartPole-v1

Where it runs decides the rendezvous:

- AWS Batch multi-node parallel job: ``AWS_BATCH_JOB_NUM_NODES`` nodes, this one is
  ``AWS_BATCH_JOB_NODE_INDEX``; the main node (``AWS_BATCH_JOB_MAIN_NODE_INDEX``) hosts the store and the
  others reach it at ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`` (Batch sets it on the children only).
- Slurm: ``SLURM_NNODES`` nodes, this one is ``SLURM_NODEID``, the first host of ``SLURM_JOB_NODELIST``
  hosts the store. Start one launcher per node (``srun --ntasks-per-node=1``).
- Anything else: a single node.

Processes per node: ``--nproc-per-node``, else the visible GPUs, else 1. The rendezvous id is the
scheduler's job id, which a retried or requeued job keeps: torchrun exports it as
``TORCHELASTIC_RUN_ID`` and ``ppo_atari_multigpu.py`` names its run folder after it, so a retry resumes
from that run's newest checkpoint when ``runs/`` is on storage that outlives the attempt.
``--max-restarts`` (default 3) restarts the worker group after a failure, which is what the
checkpoint contract of the scripts is built for.

``--array-seed START`` adds ``--seed START + index`` from ``AWS_BATCH_JOB_ARRAY_INDEX`` or
``SLURM_ARRAY_TASK_ID`` (array jobs share one command; the index picks the seed).
Only the standard library is imported until the GPU count is needed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import uuid
from dataclasses import dataclass

from cleanrl_utils.cli import Parser
from cleanrl_utils.cli import UsageError as LaunchError

DEFAULT_PORT = 29500


@dataclass
class Topology:
    scheduler: str  # "aws-batch", "slurm" or "single"
    nnodes: int
    node_rank: int
    master_addr: str | None
    run_id: str


def _int(env: dict[str, str], name: str) -> int:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        raise LaunchError(f"{name}={env.get(name)!r} is not an integer") from None


def run_id_from(job_id: str) -> str:
    # A multi-node node's job id is `<job>#<node>`: all nodes must agree, so the node part goes.
    return re.sub(r"[^A-Za-z0-9_-]", "-", job_id.split("#")[0])


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: ``gpu[07-09,12],cpu1`` -> ``gpu07``, ``r[1-2]n[3-4]`` -> ``r1n3``."""
    first, depth = "", 0
    for ch in nodelist.strip():
        if ch == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(ch, 0)
        first += ch
    # Each bracket group stands for its first element, zero padding kept.
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)
    if not host or "[" in host or "]" in host:
        raise LaunchError(f"cannot read the first host of SLURM_JOB_NODELIST={nodelist!r}")
    return host


def detect(env: dict[str, str]) -> Topology:
    if "AWS_BATCH_JOB_NUM_NODES" in env:
        nnodes = _int(env, "AWS_BATCH_JOB_NUM_NODES")
        index = _int(env, "AWS_BATCH_JOB_NODE_INDEX")
        main = _int(env, "AWS_BATCH_JOB_MAIN_NODE_INDEX") if "AWS_BATCH_JOB_MAIN_NODE_INDEX" in env else 0
        if nnodes < 1 or not 0 <= index < nnodes or not 0 <= main < nnodes:
            raise LaunchError(f"inconsistent AWS Batch node variables: {nnodes} nodes, index {index}, main {main}")
        # torchrun's static rendezvous hosts the store on node rank 0: make the main node rank 0.
        node_rank = (index - main) % nnodes
        if node_rank == 0:
            master = "127.0.0.1"  # the store is local to the main node
        else:
            master = env.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
            if not master:
                raise LaunchError("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set on a child node")
        job_id = env.get("AWS_BATCH_JOB_ID") or uuid.uuid4().hex
        return Topology("aws-batch", nnodes, node_rank, master, run_id_from(job_id))
    if "SLURM_NNODES" in env or "SLURM_JOB_NUM_NODES" in env:
        nnodes = _int(env, "SLURM_NNODES" if "SLURM_NNODES" in env else "SLURM_JOB_NUM_NODES")
        node_rank = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
        if nnodes < 1 or not 0 <= node_rank < nnodes:
            raise LaunchError(f"inconsistent Slurm variables: {nnodes} nodes, SLURM_NODEID {node_rank}")
        master = None
        if nnodes > 1:
            nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            if not nodelist:
                raise LaunchError("SLURM_JOB_NODELIST is not set")
            master = first_slurm_host(nodelist)
        job_id = env.get("SLURM_JOB_ID") or uuid.uuid4().hex
        return Topology("slurm", nnodes, node_rank, master, run_id_from(job_id))
    return Topology("single", 1, 0, None, uuid.uuid4().hex)


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m cleanrl_utils.launch",
        description="Run a script under torchrun with the rendezvous taken from AWS Batch or Slurm variables.",
        usage="python -m cleanrl_utils.launch [options] -- SCRIPT [FLAGS ...]",
    )
    p.add_argument("--nproc-per-node", type=int, default=None, help="processes per node (default: GPUs, else 1)")
    p.add_argument("--max-restarts", type=int, default=3, help="worker group restarts after a failure")
    p.add_argument(
        "--master-port",
        type=int,
        default=None,
        help=f"rendezvous port on the main node (default: MASTER_PORT, else {DEFAULT_PORT})",
    )
    p.add_argument("--array-seed", type=int, default=None, help="append --seed START + the array index")
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command and exit")
    return p


def torchrun_args(argv: list[str], env: dict[str, str]) -> tuple[list[str], Topology]:
    """The full argument vector (``python -m torch.distributed.run ...``) for this node."""
    if "--" not in argv and not {"-h", "--help"} & set(argv):
        raise LaunchError("give the script after `--`: python -m cleanrl_utils.launch -- cleanrl/ppo.py [flags]")
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:split])
    script, *flags = argv[split + 1 :] or [""]
    if not script.endswith(".py"):
        raise LaunchError(f"expected a Python script after `--`, got {script!r}")
    if not os.path.isfile(script):
        raise LaunchError(f"the script {script} does not exist (working directory {os.getcwd()})")
    if args.max_restarts < 0:
        raise LaunchError("--max-restarts must be >= 0")

    topo = detect(env)
    nproc = args.nproc_per_node if args.nproc_per_node is not None else (visible_gpus() or 1)
    if nproc < 1:
        raise LaunchError("--nproc-per-node must be >= 1")
    if args.array_seed is not None:
        index = env.get("AWS_BATCH_JOB_ARRAY_INDEX", env.get("SLURM_ARRAY_TASK_ID"))
        if index is None or not index.isdigit():
            raise LaunchError("--array-seed needs AWS_BATCH_JOB_ARRAY_INDEX or SLURM_ARRAY_TASK_ID")
        if any(f.split("=")[0] == "--seed" for f in flags):
            raise LaunchError("--array-seed sets --seed; remove --seed from the script's flags")
        flags = [*flags, "--seed", str(args.array_seed + int(index))]

    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    cmd += [f"--max-restarts={args.max_restarts}", f"--rdzv-id={topo.run_id}"]
    if topo.nnodes == 1:
        # c10d on an ephemeral local port, not --standalone, which would replace our id with a random one.
        cmd += ["--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]
    else:
        port = args.master_port or int(env.get("MASTER_PORT", DEFAULT_PORT))
        cmd += [f"--nnodes={topo.nnodes}", f"--node-rank={topo.node_rank}", "--rdzv-backend=static"]
        cmd += [f"--master-addr={topo.master_addr}", f"--master-port={port}"]
    return [*cmd, script, *flags], topo


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cmd, topo = torchrun_args(argv, dict(os.environ))
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    where = f"{topo.scheduler}: node {topo.node_rank} of {topo.nnodes}, run id {topo.run_id}"
    print(f"launch ({where}): {shlex.join(cmd)}", file=sys.stderr, flush=True)
    if "--dry-run" in argv[: argv.index("--")]:
        print(shlex.join(cmd))
        return 0
    # exec, not a child: SIGTERM from the scheduler reaches torchrun, which passes it to the workers.
    os.execv(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
