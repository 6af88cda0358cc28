"""Submit experiments to AWS Batch: one job per env x seed, array jobs, or multi-node torchrun jobs.

    python -m cleanrl_utils.submit_exp --env-ids BreakoutNoFrameskip-v4 PongNoFrameskip-v4 --num-seeds 3 \\
        --job-queue c5-12xlarge --docker-tag 123456789012.dkr.ecr.us-east-1.amazonaws.com/cleanrl:latest
    python cleanrl_utils/submit_exp.py --env-id BreakoutNoFrameskip-v4 --num-seeds 3 --num-nodes 4 \\
        --instance-type c5.12xlarge

Every job runs the image's entrypoint, ``python -m cleanrl_utils.launch``, with the container command
``-- <script> <flags> --env-id ENV --seed SEED``; the launcher turns the Batch environment into a
torchrun invocation, so a multi-node job's nodes form one torchrun job.

This file uses only the standard library, cleanrl_utils.cli and boto3 (imported when a call is about
to be made), so it runs as ``python cleanrl_utils/submit_exp.py`` from a checkout without the training
dependencies, and ``--dry-run`` works without boto3 at all.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run by path (python cleanrl_utils/submit_exp.py) from an uninstalled checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cleanrl_utils.cli import Parser, UsageError  # noqa: E402 - after the path fix above

# Must equal cleanrl_utils.checkpoint.EXIT_PREEMPTED (tests check it); not imported because that
# module needs torch, which the machine that submits jobs may not have.
EXIT_PREEMPTED = 75
DEFAULT_COMMAND = "cleanrl/ppo_atari_multigpu.py"
DEFAULT_IMAGE = "cleanrl-torchrun:latest"
SECRET_ENV = ("WANDB_API_KEY",)
MASK = "********"
TERMINAL = ("SUCCEEDED", "FAILED")
# Interpreter words users put in front of the script ("poetry run python cleanrl/ppo.py"); the
# image's entrypoint already runs Python, so they are dropped.
INTERPRETER_WORDS = {"python", "python3", "poetry", "uv", "run", "pipenv"}


@dataclass(frozen=True)
class Instance:
    vcpu: int
    memory_mib: int  # instance memory; jobs ask for 90% of it (the ECS agent and OS keep the rest)
    gpu: int


GIB = 1024
INSTANCE_TYPES: dict[str, Instance] = {
    "c5.large": Instance(2, 4 * GIB, 0),
    "c5.xlarge": Instance(4, 8 * GIB, 0),
    "c5.2xlarge": Instance(8, 16 * GIB, 0),
    "c5.4xlarge": Instance(16, 32 * GIB, 0),
    "c5.9xlarge": Instance(36, 72 * GIB, 0),
    "c5.12xlarge": Instance(48, 96 * GIB, 0),
    "c5.18xlarge": Instance(72, 144 * GIB, 0),
    "c5.24xlarge": Instance(96, 192 * GIB, 0),
    "m5.xlarge": Instance(4, 16 * GIB, 0),
    "m5.4xlarge": Instance(16, 64 * GIB, 0),
    "m5.12xlarge": Instance(48, 192 * GIB, 0),
    "g4dn.xlarge": Instance(4, 16 * GIB, 1),
    "g4dn.12xlarge": Instance(48, 192 * GIB, 4),
    "g5.xlarge": Instance(4, 16 * GIB, 1),
    "g5.12xlarge": Instance(48, 192 * GIB, 4),
    "g5.48xlarge": Instance(192, 768 * GIB, 8),
    "p3.2xlarge": Instance(8, 61 * GIB, 1),
    "p3.8xlarge": Instance(32, 244 * GIB, 4),
    "p3.16xlarge": Instance(64, 488 * GIB, 8),
    "p4d.24xlarge": Instance(96, 1152 * GIB, 8),
}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m cleanrl_utils.submit_exp",
        description="Submit experiments (env ids x seeds) to AWS Batch.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--command",
        default=DEFAULT_COMMAND,
        help="the script and its flags, e.g. 'cleanrl/ppo.py --total-timesteps 100000' (a leading 'python' is "
        "dropped); the submitter appends --env-id and --seed",
    )
    p.add_argument("--env-ids", nargs="+", default=None, help="environment ids, one job (or array job) per id")
    p.add_argument("--env-id", default=None, help="a single environment id (the one-env form of --env-ids)")
    p.add_argument("--num-seeds", type=int, default=1, help="seeds per env id")
    p.add_argument("--start-seed", type=int, default=1, help="the first seed")
    p.add_argument("--array", action="store_true", help="one array job per env id (seed = start seed + array index)")
    p.add_argument("--job-queue", default=None, help="the Batch job queue (default: derived from --instance-type)")
    p.add_argument(
        "--instance-type",
        default=None,
        help="e.g. c5.12xlarge: the job queue is <family>-<size> (c5-12xlarge) and vCPU/memory/GPU default to it",
    )
    p.add_argument("--spot", action="store_true", help="with --instance-type: use the <family>-<size>-spot queue")
    p.add_argument("--docker-tag", default=DEFAULT_IMAGE, help="the container image (push it to ECR first)")
    p.add_argument("--num-vcpu", type=int, default=None, help="vCPUs per node (default: instance type, else 1)")
    p.add_argument(
        "--num-memory", type=int, default=None, help="MiB per node (default: 90%% of the instance, else 2000)"
    )
    p.add_argument("--num-gpu", type=int, default=None, help="GPUs per node (default: instance type, else 0)")
    p.add_argument("--num-nodes", type=int, default=1, help="nodes per job; > 1 submits a multi-node parallel job")
    p.add_argument("--nproc-per-node", type=int, default=None, help="processes per node (default: visible GPUs or 1)")
    p.add_argument("--num-hours", type=float, default=24.0, help="attempt timeout in hours (0: none)")
    p.add_argument(
        "--aws-num-retries",
        type=int,
        default=3,
        help=f"retries after a host/spot termination or a checkpoint-and-exit (status {EXIT_PREEMPTED}); "
        "other failures are not retried",
    )
    p.add_argument("--endpoint-url", default=None, help="a private Batch endpoint (or a test server)")
    p.add_argument("--region", default=None, help="AWS region (default: AWS_DEFAULT_REGION, else us-east-1)")
    p.add_argument("--dry-run", action="store_true", help="print every job it would submit; call nothing")
    p.add_argument("--wait", action="store_true", help="poll until all jobs end; exit 0 only if all succeeded")
    p.add_argument("--poll-seconds", type=float, default=30.0, help="seconds between status polls with --wait")
    p.add_argument("--manifest", default=None, help="where to write the JSON manifest (default: submissions/...)")
    return p


@dataclass
class Shape:
    """What a job definition fixes; jobs of the same shape share one definition."""

    image: str
    vcpu: int
    memory: int
    gpu: int
    nodes: int

    def name(self) -> str:
        digest = hashlib.sha256(json.dumps(self.__dict__, sort_keys=True).encode()).hexdigest()[:12]
        kind = "mnp" if self.nodes > 1 else "single"
        return f"cleanrl-{kind}-{self.nodes}n-{digest}"

    def container(self) -> dict[str, Any]:
        resources = [{"type": "VCPU", "value": str(self.vcpu)}, {"type": "MEMORY", "value": str(self.memory)}]
        if self.gpu > 0:
            resources.append({"type": "GPU", "value": str(self.gpu)})
        # Docker's 64 MiB /dev/shm is too small for NCCL and for shared-memory vector envs.
        shm = max(64, min(self.memory // 4, 16 * GIB))
        return {"image": self.image, "resourceRequirements": resources, "linuxParameters": {"sharedMemorySize": shm}}

    def definition(self) -> dict[str, Any]:
        request: dict[str, Any] = {"jobDefinitionName": self.name(), "platformCapabilities": ["EC2"]}
        if self.nodes > 1:
            request["type"] = "multinode"
            request["nodeProperties"] = {
                "numNodes": self.nodes,
                "mainNode": 0,
                "nodeRangeProperties": [{"targetNodes": "0:", "container": self.container()}],
            }
        else:
            request["type"] = "container"
            request["containerProperties"] = self.container()
        return request


@dataclass
class Job:
    name: str
    env_id: str
    seeds: list[int]
    command: list[str]  # the container command (arguments of the launcher entrypoint)
    array_size: int = 0
    job_id: str | None = None
    status: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def split_command(command: str) -> tuple[str, list[str]]:
    """``'python cleanrl/ppo.py --x 1'`` -> (``cleanrl/ppo.py``, ``['--x', '1']``), validated."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise UsageError(f"--command cannot be parsed ({e})") from None
    while words and words[0] in INTERPRETER_WORDS:
        words = words[1:]
    if not words or not words[0].endswith(".py"):
        raise UsageError(f"--command must start with a script such as cleanrl/ppo.py, got {command!r}")
    script, flags = words[0], words[1:]
    if os.path.isabs(script) or ".." in script.split("/"):
        raise UsageError(f"the script {script} must be a path inside the repository (the image's working directory)")
    if not os.path.isfile(script):
        raise UsageError(f"the script {script} does not exist here; run from the repository root")
    for flag in flags:
        if flag.split("=")[0] in ("--env-id", "--seed"):
            raise UsageError(f"--command must not contain {flag.split('=')[0]}: the submitter sets it per job")
    return script, flags


def job_name(*parts: str) -> str:
    # Batch job names: up to 128 letters, digits, hyphens and underscores.
    return re.sub(r"[^A-Za-z0-9_-]", "_", "-".join(parts))[:128]


def plan(args: argparse.Namespace) -> tuple[Shape, str, list[Job]]:
    """Validate the flags and return the job shape, the queue and the jobs, without any AWS call."""
    if args.env_id is not None and args.env_ids is not None:
        raise UsageError("give --env-id or --env-ids, not both")
    env_ids = [args.env_id] if args.env_id is not None else (args.env_ids or [])
    if not env_ids or any(not e.strip() for e in env_ids):
        raise UsageError("no env ids: give --env-id ENV or --env-ids ENV [ENV ...]")
    if len(set(env_ids)) != len(env_ids):
        raise UsageError(f"--env-ids lists an id twice: {env_ids}")
    if args.num_seeds < 1:
        raise UsageError("--num-seeds must be >= 1")
    if args.num_nodes < 1:
        raise UsageError("--num-nodes must be >= 1")
    if args.array and args.num_nodes > 1:
        raise UsageError("--array cannot be combined with --num-nodes > 1 (Batch has no multi-node array jobs)")
    if args.array and not 2 <= args.num_seeds <= 10000:
        raise UsageError("--array needs 2 to 10000 seeds (--num-seeds); submit single jobs otherwise")
    if args.aws_num_retries < 0 or args.aws_num_retries > 9:
        raise UsageError("--aws-num-retries must be between 0 and 9 (Batch allows 10 attempts)")
    if args.num_hours < 0 or 0 < args.num_hours * 3600 < 60:
        raise UsageError("--num-hours must be 0 (no timeout) or at least one minute (Batch's minimum)")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise UsageError("--nproc-per-node must be >= 1")
    if args.spot and args.instance_type is None:
        raise UsageError("--spot picks the <family>-<size>-spot queue of --instance-type; give --instance-type")

    instance = None
    if args.instance_type is not None:
        instance = INSTANCE_TYPES.get(args.instance_type)
        if instance is None:
            raise UsageError(
                f"unknown --instance-type {args.instance_type}; known: {', '.join(INSTANCE_TYPES)} "
                "(or give --job-queue with --num-vcpu, --num-memory and --num-gpu)"
            )
    queue = args.job_queue
    if queue is None:
        if args.instance_type is None:
            raise UsageError("give --job-queue or --instance-type (its queue is <family>-<size>, e.g. c5-12xlarge)")
        queue = args.instance_type.replace(".", "-") + ("-spot" if args.spot else "")
    vcpu = args.num_vcpu if args.num_vcpu is not None else (instance.vcpu if instance else 1)
    memory = args.num_memory if args.num_memory is not None else (int(instance.memory_mib * 0.9) if instance else 2000)
    gpu = args.num_gpu if args.num_gpu is not None else (instance.gpu if instance else 0)
    if vcpu < 1 or memory < 4 or gpu < 0:
        raise UsageError("--num-vcpu must be >= 1, --num-memory >= 4 (MiB) and --num-gpu >= 0")
    if not args.docker_tag:
        raise UsageError("--docker-tag must name an image")

    script, flags = split_command(args.command)
    launcher = ["--nproc-per-node", str(args.nproc_per_node)] if args.nproc_per_node else []
    stem = os.path.splitext(os.path.basename(script))[0]
    seeds = list(range(args.start_seed, args.start_seed + args.num_seeds))
    jobs = []
    for env_id in env_ids:
        if args.array:
            # The launcher adds --seed START + AWS_BATCH_JOB_ARRAY_INDEX inside each child.
            command = [*launcher, "--array-seed", str(args.start_seed), "--", script, *flags, "--env-id", env_id]
            name = job_name(stem, env_id, f"seeds{seeds[0]}to{seeds[-1]}")
            jobs.append(Job(name, env_id, seeds, command, array_size=len(seeds)))
        else:
            for seed in seeds:
                command = [*launcher, "--", script, *flags, "--env-id", env_id, "--seed", str(seed)]
                jobs.append(Job(job_name(stem, env_id, str(seed)), env_id, [seed], command))
    return Shape(args.docker_tag, vcpu, memory, gpu, args.num_nodes), queue, jobs


def retry_strategy(num_retries: int) -> dict[str, Any] | None:
    """Retry what a retry can fix: a lost host (spot reclaim, instance failure) or a checkpoint-and-exit."""
    if num_retries == 0:
        return None
    return {
        "attempts": num_retries + 1,
        # The first match decides; without the final catch-all Batch would retry every failure.
        "evaluateOnExit": [
            {"onStatusReason": "Host EC2*", "action": "RETRY"},
            {"onExitCode": str(EXIT_PREEMPTED), "action": "RETRY"},
            {"onReason": "*", "action": "EXIT"},
        ],
    }


def job_environment() -> list[dict[str, str]]:
    return [{"name": name, "value": os.environ[name]} for name in SECRET_ENV if os.environ.get(name)]


def submit_request(job: Job, shape: Shape, queue: str, definition_arn: str, args: argparse.Namespace) -> dict:
    overrides = {"command": job.command, "environment": job_environment()}
    request: dict[str, Any] = {"jobName": job.name, "jobQueue": queue, "jobDefinition": definition_arn}
    if shape.nodes > 1:
        request["nodeOverrides"] = {"nodePropertyOverrides": [{"targetNodes": "0:", "containerOverrides": overrides}]}
    else:
        request["containerOverrides"] = overrides
    if job.array_size:
        request["arrayProperties"] = {"size": job.array_size}
    strategy = retry_strategy(args.aws_num_retries)
    if strategy:
        request["retryStrategy"] = strategy
    if args.num_hours > 0:
        request["timeout"] = {"attemptDurationSeconds": int(round(args.num_hours * 3600))}
    return request


def masked(request: dict[str, Any]) -> dict[str, Any]:
    """A copy of a request that is safe to print: secret values replaced."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            if value.get("name") in SECRET_ENV and "value" in value:
                return {**value, "value": MASK}
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(request)


def make_client(args: argparse.Namespace):
    try:
        import boto3
    except ImportError:
        raise UsageError("boto3 is not installed: pip install -r requirements/requirements-cloud.txt") from None
    region = args.region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.client("batch", region_name=region, endpoint_url=args.endpoint_url)


def ensure_definition(client, shape: Shape) -> str:
    """The ARN of the active definition for this shape, registering it only if none exists yet."""
    name = shape.name()
    found = client.describe_job_definitions(jobDefinitionName=name, status="ACTIVE").get("jobDefinitions", [])
    if found:
        newest = max(found, key=lambda d: d["revision"])
        print(f"job definition {name}:{newest['revision']} (reused)")
        return newest["jobDefinitionArn"]
    arn = client.register_job_definition(**shape.definition())["jobDefinitionArn"]
    print(f"job definition {arn.rsplit('/', 1)[-1]} (registered)")
    return arn


def write_manifest(path: str, payload: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def manifest_payload(args, shape: Shape, queue: str, definition_arn: str | None, jobs: list[Job]) -> dict[str, Any]:
    return {
        "submitted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "job_queue": queue,
        "job_definition": definition_arn,
        "shape": shape.__dict__,
        "region": args.region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        "endpoint_url": args.endpoint_url,
        # Names only: the values of secrets never reach disk.
        "environment_names": [e["name"] for e in job_environment()],
        "jobs": [
            {
                "name": j.name,
                "job_id": j.job_id,
                "env_id": j.env_id,
                "seeds": j.seeds,
                "array_size": j.array_size or None,
                "command": j.command,
                "status": j.status,
            }
            for j in jobs
        ],
    }


def status_of(described: dict[str, Any]) -> str:
    """A job's status; an array parent counts as ended once all its children have ended."""
    summary = (described.get("arrayProperties") or {}).get("statusSummary")
    size = (described.get("arrayProperties") or {}).get("size")
    if summary and size:
        if summary.get("SUCCEEDED", 0) == size:
            return "SUCCEEDED"
        if summary.get("SUCCEEDED", 0) + summary.get("FAILED", 0) == size:
            return "FAILED"
    return described["status"]


def status_table(jobs: list[Job]) -> str:
    width = max(len(j.name) for j in jobs)
    lines = [f"{'job':<{width}}  {'status':<9}  job id"]
    for j in jobs:
        lines.append(f"{j.name:<{width}}  {j.status or '?':<9}  {j.job_id}")
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.status or "?"] = counts.get(j.status or "?", 0) + 1
    lines.append("  ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def wait_for(client, jobs: list[Job], poll_seconds: float) -> bool:
    last = None
    while True:
        ids = [j.job_id for j in jobs]
        described = {}
        for start in range(0, len(ids), 100):  # describe_jobs takes at most 100 ids
            for d in client.describe_jobs(jobs=ids[start : start + 100])["jobs"]:
                described[d["jobId"]] = d
        for j in jobs:
            if j.job_id in described:
                j.status = status_of(described[j.job_id])
                reason = described[j.job_id].get("statusReason")
                if reason:
                    j.extra["status_reason"] = reason
        table = status_table(jobs)
        if table != last:
            print(f"[{time.strftime('%H:%M:%S')}]\n{table}", flush=True)
            last = table
        if all(j.status in TERMINAL for j in jobs):
            return all(j.status == "SUCCEEDED" for j in jobs)
        time.sleep(poll_seconds)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        shape, queue, jobs = plan(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if args.dry_run:
        print(f"dry run: {len(jobs)} job(s) to queue {queue}; nothing is submitted")
        print("job definition:", json.dumps(shape.definition()))
        for job in jobs:
            print(json.dumps(masked(submit_request(job, shape, queue, f"<{shape.name()}>", args))))
        return 0

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    manifest = args.manifest or os.path.join("submissions", f"submit_{stamp}_{os.getpid()}.json")
    try:
        client = make_client(args)
        queues = client.describe_job_queues(jobQueues=[queue]).get("jobQueues", [])
        if not queues:
            raise UsageError(f"job queue {queue} does not exist in this region; create it or pass --job-queue")
        definition_arn = ensure_definition(client, shape)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # botocore's errors: credentials, endpoint, permissions
        print(f"error: AWS Batch call failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1

    submitted: list[Job] = []
    try:
        for job in jobs:
            response = client.submit_job(**submit_request(job, shape, queue, definition_arn, args))
            job.job_id, job.status = response["jobId"], "SUBMITTED"
            submitted.append(job)
            seeds = f"seeds {job.seeds[0]}..{job.seeds[-1]}" if job.array_size else f"seed {job.seeds[0]}"
            print(f"submitted {job.name} ({job.env_id}, {seeds}) job id {job.job_id}", flush=True)
    except Exception as e:
        # Record what did go out, so those jobs can be found and cancelled.
        write_manifest(manifest, manifest_payload(args, shape, queue, definition_arn, submitted))
        print(f"error: submitting failed after {len(submitted)} job(s): {type(e).__name__}: {e}", file=sys.stderr)
        print(f"manifest: {manifest}")
        return 1
    write_manifest(manifest, manifest_payload(args, shape, queue, definition_arn, jobs))
    print(f"{len(jobs)} job(s) submitted to {queue}; manifest: {manifest}")
    if not args.wait:
        return 0
    ok = wait_for(client, jobs, args.poll_seconds)
    write_manifest(manifest, manifest_payload(args, shape, queue, definition_arn, jobs))
    for job in jobs:
        if job.status != "SUCCEEDED":
            print(f"  {job.name}: {job.status} ({job.extra.get('status_reason', 'no reason given')})")
    print("all jobs succeeded" if ok else "some jobs did not succeed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
