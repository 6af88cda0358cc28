"""Run a script over env ids x seeds: locally with a bounded worker pool, or as a Slurm array job.

    python -m cleanrl_utils.benchmark --env-ids CartPole-v1 Acrobot-v1 --num-seeds 3 --workers 2 \\
        --command "python cleanrl/ppo.py --total-timesteps 50000"
    python -m cleanrl_utils.benchmark --env-ids BreakoutNoFrameskip-v4 --num-seeds 3 \\
        --command "cleanrl/ppo_atari_multigpu.py" --slurm-template cleanrl_utils/templates/slurm_array.sbatch \\
        --slurm-nodes 2 --slurm-gpus-per-node 4 --slurm-partition gpu [--dry-run]

Locally every run writes its output to ``<log-dir>/<env>__<script>__<seed>.log``; the summary lists
the failed runs and the exit status is 1 if any failed. With ``--slurm-template`` the template is
rendered (every value shell-quoted) and given to ``sbatch``; ``--dry-run`` prints it instead.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from cleanrl_utils.cli import Parser, UsageError

DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "templates" / "slurm_array.sbatch"
PYTHON_WORDS = {"python", "python3"}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m cleanrl_utils.benchmark",
        description="Run a command over env ids x seeds, locally or as a Slurm array job.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--command", required=True, help="the script and its flags; --env-id and --seed are appended")
    p.add_argument("--env-ids", nargs="+", required=True, help="environment ids")
    p.add_argument("--num-seeds", type=int, default=3, help="seeds per env id")
    p.add_argument("--start-seed", type=int, default=1, help="the first seed")
    p.add_argument("--workers", type=int, default=1, help="runs at the same time (local mode)")
    p.add_argument("--timeout", type=float, default=0, help="seconds before a local run is stopped (0: none)")
    p.add_argument("--log-dir", default=None, help="where logs go (default: benchmark_logs/<time>)")
    p.add_argument("--slurm-template", default=None, help=f"render and sbatch this template (e.g. {DEFAULT_TEMPLATE})")
    p.add_argument("--slurm-nodes", type=int, default=1, help="nodes per array task (one torchrun job)")
    p.add_argument("--slurm-cpus-per-task", type=int, default=4, help="CPUs per node and task")
    p.add_argument("--slurm-gpus-per-node", type=int, default=0, help="GPUs per node")
    p.add_argument("--slurm-partition", default=None, help="partition")
    p.add_argument("--slurm-time", default="24:00:00", help="time limit per task")
    p.add_argument("--slurm-max-parallel", type=int, default=16, help="array tasks running at once")
    p.add_argument(
        "--slurm-option",
        action="append",
        default=[],
        help="an extra #SBATCH option, written --slurm-option=--account=rl",
    )
    p.add_argument("--python", default="python", help="the interpreter on the compute nodes (Slurm mode)")
    p.add_argument("--dry-run", action="store_true", help="Slurm mode: print the rendered script, submit nothing")
    return p


@dataclass
class Run:
    env_id: str
    seed: int
    argv: list[str]
    log: Path
    returncode: int | None = None
    seconds: float = 0.0


def parse_command(command: str) -> tuple[str, list[str]]:
    """The script (checked to exist) and its flags; a leading `python` is dropped."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise UsageError(f"--command cannot be parsed ({e})") from None
    while words and words[0] in PYTHON_WORDS:
        words = words[1:]
    if not words or not words[0].endswith(".py"):
        raise UsageError(f"--command must start with a script such as cleanrl/ppo.py, got {command!r}")
    if not os.path.isfile(words[0]):
        raise UsageError(f"the script {words[0]} does not exist (working directory {os.getcwd()})")
    for word in words[1:]:
        if word.split("=")[0] in ("--env-id", "--seed"):
            raise UsageError(f"--command must not contain {word.split('=')[0]}: the benchmark sets it per run")
    return words[0], words[1:]


def validate(args: argparse.Namespace) -> None:
    if args.num_seeds < 1 or args.workers < 1 or args.timeout < 0:
        raise UsageError("--num-seeds and --workers must be >= 1 and --timeout >= 0")
    if len(set(args.env_ids)) != len(args.env_ids):
        raise UsageError(f"--env-ids lists an id twice: {args.env_ids}")
    if args.slurm_template is None and args.dry_run:
        raise UsageError("--dry-run prints the rendered Slurm script: give --slurm-template")
    if args.slurm_template is not None:
        if not os.path.isfile(args.slurm_template):
            raise UsageError(f"the Slurm template {args.slurm_template} does not exist")
        if args.slurm_nodes < 1 or args.slurm_cpus_per_task < 1 or args.slurm_gpus_per_node < 0:
            raise UsageError("--slurm-nodes and --slurm-cpus-per-task must be >= 1, --slurm-gpus-per-node >= 0")
        if args.slurm_max_parallel < 1:
            raise UsageError("--slurm-max-parallel must be >= 1")


def run_one(run: Run, timeout: float, stopping: threading.Event, env: dict[str, str]) -> Run:
    start = time.monotonic()
    run.log.parent.mkdir(parents=True, exist_ok=True)
    with open(run.log, "w") as log:
        log.write(f"$ {shlex.join(run.argv)}\n")
        log.flush()
        if stopping.is_set():
            run.returncode = -1
            return run
        # Its own session: Ctrl-C reaches the benchmark once, which then stops every run cleanly.
        proc = subprocess.Popen(run.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = start + timeout if timeout else None
        while proc.poll() is None:
            if stopping.is_set() or (deadline and time.monotonic() > deadline):
                # SIGTERM first: the scripts checkpoint and exit 75 on it.
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                log.write(
                    "\n[benchmark] stopped (timeout)\n" if not stopping.is_set() else "\n[benchmark] interrupted\n"
                )
                break
            time.sleep(0.2)
        run.returncode = proc.returncode
    run.seconds = time.monotonic() - start
    return run


def last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def run_local(args: argparse.Namespace, script: str, flags: list[str], log_dir: Path) -> int:
    stem = Path(script).stem
    seeds = range(args.start_seed, args.start_seed + args.num_seeds)
    runs = [
        Run(env, seed, [sys.executable, script, *flags, "--env-id", env, "--seed", str(seed)],
            log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', env)}__{stem}__{seed}.log")
        for env in args.env_ids
        for seed in seeds
    ]  # fmt: skip
    print(f"{len(runs)} runs of {script} with {args.workers} worker(s); logs in {log_dir}", flush=True)
    env = dict(os.environ)
    # Runs side by side share the cores: without this each torch would start one thread per core.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.workers)))
    stopping = threading.Event()
    done = 0
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_one, run, args.timeout, stopping, env) for run in runs]
        try:
            for future in as_completed(futures):
                run = future.result()
                done += 1
                state = "ok" if run.returncode == 0 else f"FAILED (exit {run.returncode})"
                print(f"[{done}/{len(runs)}] {state:<16} {run.env_id} seed={run.seed} {run.seconds:.1f}s", flush=True)
        except KeyboardInterrupt:
            stopping.set()
            print("interrupted: stopping the running runs", flush=True)
    failed = [r for r in runs if r.returncode != 0]
    print(f"summary: {len(runs) - len(failed)} of {len(runs)} runs succeeded, {len(failed)} failed")
    for r in failed:
        print(f"  failed: {r.env_id} seed={r.seed} exit={r.returncode} log={r.log}")
        print(f"          {last_line(r.log)}")
    return 1 if failed else 0


def render(template: str, values: dict[str, str]) -> str:
    """Fill ``{{name}}`` placeholders; an unknown or unfilled one is an error, never left for the shell."""

    def fill(match: re.Match) -> str:
        if match.group(1) not in values:
            raise UsageError(f"the template uses {{{{{match.group(1)}}}}}, which the benchmark does not provide")
        return values[match.group(1)]

    return re.sub(r"\{\{\s*([A-Za-z_]+)\s*\}\}", fill, template)


def slurm_script(args: argparse.Namespace, script: str, flags: list[str], log_dir: Path) -> str:
    seeds = [str(s) for s in range(args.start_seed, args.start_seed + args.num_seeds)]
    options = [f"#SBATCH --partition={args.slurm_partition}"] if args.slurm_partition else []
    if args.slurm_gpus_per_node:
        options.append(f"#SBATCH --gpus-per-node={args.slurm_gpus_per_node}")
    for option in args.slurm_option:
        if "\n" in option or not option.startswith("--"):
            raise UsageError(f"--slurm-option must be one sbatch option such as --account=rl, got {option!r}")
        options.append(f"#SBATCH {option}")
    values = {
        "job_name": re.sub(r"[^A-Za-z0-9_.-]", "_", Path(script).stem),
        "last_task": str(len(args.env_ids) * len(seeds) - 1),
        "max_parallel": str(args.slurm_max_parallel),
        "nodes": str(args.slurm_nodes),
        "cpus_per_task": str(args.slurm_cpus_per_task),
        "time_limit": re.sub(r"[^0-9:-]", "", args.slurm_time),
        "log_dir": shlex.quote(str(log_dir.resolve())),
        "sbatch_options": "\n".join(options),
        "env_ids": " ".join(shlex.quote(e) for e in args.env_ids),
        "seeds": " ".join(seeds),
        "command": shlex.join([script, *flags]),
        "workdir": shlex.quote(os.getcwd()),
        "python": shlex.quote(args.python),
    }
    return render(Path(args.slurm_template).read_text(), values)


def submit_slurm(args: argparse.Namespace, script: str, flags: list[str], log_dir: Path) -> int:
    text = slurm_script(args, script, flags, log_dir)
    if args.dry_run:
        print(text, end="")
        return 0
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        print(
            "error: sbatch not found on PATH; run on a Slurm login node, or --dry-run to see the script",
            file=sys.stderr,
        )
        return 2
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / "slurm_array.sbatch"
    path.write_text(text)
    proc = subprocess.run([sbatch, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"error: sbatch failed (exit {proc.returncode}): {proc.stderr.strip()}", file=sys.stderr)
        return 1
    tasks = len(args.env_ids) * args.num_seeds
    print(f"{proc.stdout.strip()} ({tasks} array tasks); script {path}; logs in {log_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        validate(args)
        script, flags = parse_command(args.command)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        log_dir = Path(args.log_dir or os.path.join("benchmark_logs", stamp))
        if args.slurm_template is not None:
            return submit_slurm(args, script, flags, log_dir)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_local(args, script, flags, log_dir)


if __name__ == "__main__":
    sys.exit(main())
