"""Throughput of the Atari PPO training loop against what its parts allow, measured in one run.

    python benchmark/throughput.py --reps 3 --out docs/benchmarks/throughput.md

On the current machine (all its cores), with the agent and make_env of cleanrl/ppo_atari_multigpu.py:
  (a) env-only steps/s of 8 Breakout envs, random actions: in-process (SyncVectorEnv), subprocess
      workers with shared memory (AsyncVectorEnv, `--env-backend gymnasium`), ale_py's C++ vector
      env behind the scripts' AleVecEnv (`--env-backend ale`), and envpool if installed;
  (b) policy inference per env step (a batch of 8 observations, inference mode; with bf16 the
      scripts' bf16 copy of the weights);
  (c) update-only samples/s (PPO minibatch of 256 through the scripts' ppo_loss: forward, loss,
      backward, Adam) for each variant of layout, precision and torch.compile;
  (d) end-to-end training SPS of ppo_atari.py and of ppo_atari_multigpu.py with 1 and 2 processes
      (torchrun, gloo) at the same global batch (8 envs x 128 steps, 4 minibatches, 4 epochs: the
      defaults), for each set of throughput flags; steady state: the steps between the end of the
      first iteration and the end of the last over the time between them.
The sequential bound of a variant is 1 / (1/env + 1/inference + update_epochs/update): the SPS of a
loop that steps the envs, acts and updates one after another with nothing overlapped, from (a) the
variant's env backend, (b) and (c) of the same variant. A 2-process run does each part as two
processes at once, each with half the envs, half the minibatch and half the cores, which can be
faster than one process with all of them; so for the 2-process rows the parts are also measured
that way, (a2), (b2) and (c2), and give a second, stricter bound. Measurements are repeated --reps times,
interleaved, and the medians are reported with each training SPS's ratio to its bound.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]
ENV_ID = "BreakoutNoFrameskip-v4"
# name -> (channels_last, bf16, env backend, torch.compile, the script flags)
VARIANTS = {
    "fp32": (False, False, "gymnasium", False, ["--no-channels-last"]),
    "channels_last": (True, False, "gymnasium", False, ["--channels-last"]),
    "bf16": (False, True, "gymnasium", False, ["--no-channels-last", "--bf16"]),
    "bf16+channels_last": (True, True, "gymnasium", False, ["--channels-last", "--bf16"]),
    "channels_last+ale": (True, False, "ale", False, ["--channels-last", "--env-backend", "ale"]),
    "bf16+channels_last+ale": (True, True, "ale", False, ["--channels-last", "--bf16", "--env-backend", "ale"]),
    "bf16+channels_last+ale+compile": (
        True,
        True,
        "ale",
        True,
        ["--channels-last", "--bf16", "--env-backend", "ale", "--compile"],
    ),  # fmt: skip
}
DEFAULT_VARIANTS = ["fp32", "channels_last", "bf16+channels_last", "channels_last+ale", "bf16+channels_last+ale",
                    "bf16+channels_last+ale+compile"]  # fmt: skip
ANALYSIS_HEADING = "## What was kept"
PART_WINDOW = 4.0  # seconds that the processes of part_rate_in_processes measure, all at the same time
TRAIN = ["--env-id", ENV_ID, "--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "4", "--no-cuda"]


def load_script(name="ppo_atari_multigpu"):
    spec = importlib.util.spec_from_file_location(name, REPO / "cleanrl" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def env_op(module, kind: str, num_envs: int, threads: int):
    """(one vector step of random actions, env steps per call, close) for an env setup; None if not installed."""
    if kind == "envpool":
        try:
            import envpool
        except ImportError:
            return None
        envs = envpool.make(ENV_ID.replace("NoFrameskip-v4", "-v5"), env_type="gymnasium", num_envs=num_envs,
                            episodic_life=True, reward_clip=True, stack_num=4)  # fmt: skip
        envs.reset()
        sample = lambda: np.random.randint(0, envs.action_space.n, num_envs)  # noqa: E731
    elif kind == "ale":
        envs = module.AleVecEnv(ENV_ID, num_envs, num_threads=threads)
        envs.reset(seed=0)
        envs.step = lambda actions: (envs.step_async(actions), envs.step_wait())
        sample = lambda: np.random.randint(0, envs.single_action_space.n, num_envs)  # noqa: E731
    else:
        thunks = [module.make_env(ENV_ID, i, False, "bench") for i in range(num_envs)]
        if kind == "sync":
            envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=AutoresetMode.SAME_STEP)
        else:
            envs = gym.vector.AsyncVectorEnv(thunks, shared_memory=True, autoreset_mode=AutoresetMode.SAME_STEP)
        envs.reset(seed=0)
        envs.action_space.seed(0)
        sample = envs.action_space.sample
    return (lambda: envs.step(sample())), num_envs, envs.close


def env_rate(module, kind: str, num_envs: int = 8, steps: int = 300) -> float | None:
    setup = env_op(module, kind, num_envs, os.cpu_count())
    if setup is None:
        return None
    step, units, close = setup
    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    elapsed = time.perf_counter() - start
    close()
    return steps * units / elapsed


def make_agent(module, channels_last: bool):
    torch.manual_seed(0)
    agent = module.Agent(types.SimpleNamespace(single_action_space=gym.spaces.Discrete(4)))
    if channels_last:
        agent = agent.to(memory_format=torch.channels_last)
        agent.channels_last = True
    return agent


def inference_op(module, channels_last: bool, bf16: bool, num_envs: int):
    """(one acting call for num_envs envs, env steps per call), as the scripts act."""
    agent = make_agent(module, channels_last)
    if bf16:
        agent = agent.to(torch.bfloat16)  # as the scripts act: a bf16 copy of the weights, under autocast
    obs = torch.randint(0, 255, (num_envs, 4, 84, 84), dtype=torch.uint8)
    # As the scripts act: the frames are preprocessed into the rollout storage, and the policy reads them there.
    storage = module.frame_storage(
        (1, num_envs), (4, 84, 84), torch.bfloat16 if bf16 else torch.float32, channels_last, "cpu"
    )

    def act():
        storage[0] = agent.preprocess(obs)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            agent.get_action_and_value(storage[0])

    return act, num_envs


def inference_rate(module, channels_last: bool, bf16: bool, num_envs: int = 8, calls: int = 200) -> float:
    """Env steps per second that the acting path alone allows (one call acts for num_envs envs)."""
    torch.set_num_threads(os.cpu_count())
    act, units = inference_op(module, channels_last, bf16, num_envs)
    times = []
    for i in range(calls + 10):
        start = time.perf_counter()
        act()
        if i >= 10:
            times.append(time.perf_counter() - start)
    return units / statistics.median(times)


def update_op(module, channels_last: bool, bf16: bool, minibatch: int, compiled=False):
    """(one PPO minibatch update, samples per update), as the scripts update."""
    agent = make_agent(module, channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True)  # as the scripts
    # As the scripts update: minibatches gathered from a rollout storage of preprocessed frames (4 minibatches).
    frames = torch.randint(0, 255, (4 * minibatch, 4, 84, 84), dtype=torch.uint8)
    storage = module.frame_storage((4 * minibatch,), (4, 84, 84), torch.bfloat16 if bf16 else torch.float32,
                                   channels_last, "cpu")  # fmt: skip
    storage[:] = agent.preprocess(frames)
    actions = torch.randint(0, 4, (minibatch,))
    old_logprobs = torch.full((minibatch,), -np.log(4.0))
    advantages, returns, values = torch.randn(minibatch), torch.randn(minibatch), torch.randn(minibatch)
    args = module.Args(bf16=bf16)
    # The scripts' own loss; torch.compile of it as --compile does (the backward runs through the compiled graph).
    loss_fn = torch.compile(module.ppo_loss) if compiled else module.ppo_loss

    def update():
        obs = storage[torch.randperm(4 * minibatch)[:minibatch]]
        loss = loss_fn(agent, args, obs, actions, old_logprobs, advantages, returns, values)[0]
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        optimizer.step()

    return update, minibatch


def update_rate(module, channels_last: bool, bf16: bool, minibatch: int = 256, updates: int = 12, compiled=False):
    torch.set_num_threads(os.cpu_count())
    update, units = update_op(module, channels_last, bf16, minibatch, compiled)
    for _ in range(3 if compiled else 2):
        update()
    times = []
    for _ in range(updates):
        start = time.perf_counter()
        update()
        times.append(time.perf_counter() - start)
    return minibatch / statistics.median(times)


def part_worker(part: str, name: str, nproc: int) -> None:
    """One of nproc processes that measure a part at the same time (--part-worker): its share of the work
    (8 // nproc envs, minibatches of 256 // nproc) on cores // nproc threads, as a rank of torchrun does.
    It sets up and warms up, says "ready", waits for "go" on stdin, then works for PART_WINDOW seconds
    and prints its rate."""
    module = load_script()
    threads = max(1, os.cpu_count() // nproc)
    torch.set_num_threads(threads)
    close = None
    if part == "env":
        op, units, close = env_op(module, name, 8 // nproc, threads)
    else:
        channels_last, bf16, _, compiled, _ = VARIANTS[name]
        if part == "inference":
            op, units = inference_op(module, channels_last, bf16, 8 // nproc)
        else:
            op, units = update_op(module, channels_last, bf16, 256 // nproc, compiled)
    for _ in range(5):
        op()
    print("ready", flush=True)
    sys.stdin.readline()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < PART_WINDOW:
        op()
        count += 1
    rate = units * count / (time.perf_counter() - start)
    if close is not None:
        close()
    print(rate, flush=True)


def part_rate_in_processes(part: str, name: str, nproc: int = 2) -> float:
    """The machine's rate for a part (env: a backend; inference, update: a variant) when nproc processes
    each do their share at the same time, as the ranks of a torchrun job do: the sum of their rates."""
    cmd = [sys.executable, __file__, "--part-worker", part, name, str(nproc)]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(nproc)]
    for proc in procs:  # all set up and warmed up before any starts
        while (line := proc.stdout.readline()) and line.strip() != "ready":
            pass
        if not line:  # it ended before it was ready: stop the others and say which part failed
            for other in procs:
                other.kill()
            raise SystemExit(f"error: a --part-worker {part} {name} process failed while setting up")
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outs = [proc.communicate()[0] for proc in procs]
    if any(proc.returncode != 0 for proc in procs):
        raise SystemExit(f"error: a --part-worker {part} {name} process failed")
    return sum(float(out.strip().splitlines()[-1]) for out in outs)


def training_sps(script: str | Path, nproc: int, flags: list[str], iterations: int) -> float:
    """Steady-state SPS of one run of a script of cleanrl/ (a name), or of any copy of one (a path)."""
    total = 1024 * iterations
    with tempfile.TemporaryDirectory() as tmp:
        args = [*TRAIN, "--total-timesteps", str(total), *flags, "--checkpoint-frequency", "0"]
        path = str(script if isinstance(script, Path) else REPO / "cleanrl" / script)
        if nproc == 1:
            cmd = [sys.executable, path, *args, "--num-envs", "8"]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", path,
                   *args, "--num-envs", "8"]  # fmt: skip
        subprocess.run(cmd, cwd=tmp, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
        acc = EventAccumulator(glob.glob(f"{tmp}/runs/*")[0], size_guidance={"scalars": 0})
        acc.Reload()
        events = acc.Scalars("losses/value_loss")
        first, last = events[0], events[-1]
        return (last.step - first.step) / (last.wall_time - first.wall_time)


def micro(module) -> None:
    """Changes measured alone, on one thread (a process of a 2-process run), medians of 40 calls:
    the input path (how a minibatch of 128 frame stacks becomes the network's input, and what storing
    that input in the rollout saves per bf16 update) and Adam's for-loop against fused=True."""
    torch.set_num_threads(1)
    frames = torch.randint(0, 255, (128, 4, 84, 84), dtype=torch.uint8)
    cl = torch.channels_last

    def median_ms(fn, calls=40):
        times = []
        for _ in range(calls + 5):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1000 * statistics.median(times[5:])

    old = median_ms(lambda: (frames.contiguous(memory_format=cl) / 255.0).to(torch.bfloat16))
    new = median_ms(lambda: frames.contiguous(memory_format=cl).float().div_(255.0).to(torch.bfloat16))
    print(f"uint8 frames -> bf16 input, minibatch of 128: frames / 255.0 {old:.1f} ms, frames.float().div_(255.0) "
          f"{new:.1f} ms (same values)")  # fmt: skip
    agent = make_agent(module, channels_last=True)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True)
    args = module.Args(bf16=True)
    # A rollout of one process of a 2-process run (512 frame stacks), as uint8 frames and as the stored input;
    # each update gathers a random minibatch of 128 from it, as the scripts do.
    rollout = torch.randint(0, 255, (512, 4, 84, 84), dtype=torch.uint8)
    stored = module.frame_storage((512,), (4, 84, 84), torch.bfloat16, True, "cpu")
    stored[:] = agent.preprocess(rollout)
    n = len(frames)
    rest = (torch.randint(0, 4, (n,)), torch.full((n,), -1.4), torch.randn(n), torch.randn(n), torch.randn(n))

    def update(source):
        loss = module.ppo_loss(agent, args, source[torch.randperm(len(source))[:n]], *rest)[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    from_frames, from_storage = median_ms(lambda: update(rollout)), median_ms(lambda: update(stored))
    print(f"bf16 update of a minibatch of 128 gathered from a rollout of 512: from uint8 frames {from_frames:.1f} ms, "
          f"from the stored input {from_storage:.1f} ms ({from_frames - from_storage:.1f} ms of conversion saved)")  # fmt: skip
    agent = make_agent(module, channels_last=True)
    for p in agent.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    rates = []
    for fused in (False, True):
        optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=fused)
        rates.append(median_ms(optimizer.step))
    print(f"Adam step of the 1,686,693 parameters: for-loop {rates[0]:.2f} ms, fused {rates[1]:.2f} ms "
          f"({rates[0] / rates[1]:.1f}x)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=6, help="training iterations of 1024 steps per run")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    parser.add_argument("--env-groups", type=int, nargs="+", default=[1], help="--env-groups values to train with")
    parser.add_argument(
        "--overlap-variants",
        nargs="*",
        default=["bf16+channels_last+ale"],
        choices=list(VARIANTS),
        help="variants also trained with --env-groups 2 (stepping one half while acting for the other)",
    )
    parser.add_argument("--out", default=None, help="write the markdown report (and a PNG beside it)")
    parser.add_argument(
        "--compile-update", action="store_true", help="only: update rates with and without torch.compile"
    )
    parser.add_argument("--micro", action="store_true", help="only: the input path and fused Adam, alone")
    parser.add_argument("--part-worker", nargs=3, metavar=("PART", "NAME", "NPROC"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.part_worker:
        part, name, nproc = opts.part_worker
        part_worker(part, name, int(nproc))
        return
    module = load_script()
    if opts.micro:
        micro(module)
        return
    if opts.compile_update:
        for variant in opts.variants:
            channels_last, bf16 = VARIANTS[variant][:2]
            rates = [update_rate(module, channels_last, bf16, compiled=c) for c in (False, True)]
            print(f"{variant}: update {256000 / rates[0]:.0f} ms, compiled {256000 / rates[1]:.0f} ms per minibatch "
                  f"({rates[1] / rates[0]:.2f}x)")  # fmt: skip
        return
    accepts_flags = "channels_last" in load_script("ppo_atari").Args.__dataclass_fields__

    env = {kind: [] for kind in ("sync", "async", "ale", "envpool")}
    infer = {v: [] for v in opts.variants}
    update = {v: [] for v in opts.variants}
    # (script, processes, variant, env groups) -> SPS samples
    configs = []
    for variant in opts.variants:
        groups_list = sorted({*opts.env_groups, 2}) if variant in opts.overlap_variants else opts.env_groups
        for groups in groups_list:
            configs.append(("ppo_atari_multigpu.py", 1, variant, groups))
            configs.append(("ppo_atari_multigpu.py", 2, variant, groups))
            if accepts_flags:
                configs.append(("ppo_atari.py", 1, variant, groups))
    if not accepts_flags:
        configs.append(("ppo_atari.py", 1, None, 1))
    train = {config: [] for config in configs}
    # The parts also measured as the 2-process runs do them: two processes at once, each with its share.
    two_proc = sorted({c[2] for c in configs if c[1] == 2 and c[2] is not None}, key=opts.variants.index)
    env2 = {kind: [] for kind in sorted({"async" if VARIANTS[v][2] == "gymnasium" else "ale" for v in two_proc})}
    infer2, update2 = {v: [] for v in two_proc}, {v: [] for v in two_proc}
    for rep in range(opts.reps):
        for kind in env:
            rate = env_rate(module, kind)
            if rate is not None:
                env[kind].append(rate)
        for variant in opts.variants:
            channels_last, bf16, _, compiled, _ = VARIANTS[variant]
            infer[variant].append(inference_rate(module, channels_last, bf16))
            update[variant].append(update_rate(module, channels_last, bf16, compiled=compiled))
        for kind in env2:
            env2[kind].append(part_rate_in_processes("env", kind))
        for variant in two_proc:
            infer2[variant].append(part_rate_in_processes("inference", variant))
            update2[variant].append(part_rate_in_processes("update", variant))
        for config in configs:
            script, nproc, variant, groups = config
            flags = [] if variant is None else [*VARIANTS[variant][4], "--env-groups", str(groups)]
            train[config].append(training_sps(script, nproc, flags, opts.iterations))
            print(f"rep {rep}: {config} {train[config][-1]:.0f} SPS", flush=True)

    med = statistics.median

    def bound(variant, nproc=1):
        kind = "async" if VARIANTS[variant][2] == "gymnasium" else "ale"
        if nproc == 2:
            rates = med(env2[kind]), med(infer2[variant]), med(update2[variant])
        else:
            rates = med(env[kind]), med(infer[variant]), med(update[variant])
        return 1.0 / (1.0 / rates[0] + 1.0 / rates[1] + 4.0 / rates[2])

    lines = ["| measurement | median |", "|---|---|"]
    for kind, label in (("sync", "in-process (SyncVectorEnv)"), ("async", "subprocess workers, shared memory"),
                        ("ale", "ale_py vector env (`--env-backend ale`)"), ("envpool", "envpool")):  # fmt: skip
        value = f"{med(env[kind]):.0f}" if env[kind] else "not installed"
        lines.append(f"| (a) env-only steps/s, 8 envs, {label} | {value} |")
    for variant in opts.variants:
        lines.append(f"| (b) inference, {variant}: env steps/s (ms per call of 8) | {med(infer[variant]):.0f} "
                     f"({8000 / med(infer[variant]):.1f} ms) |")  # fmt: skip
    for variant in opts.variants:
        lines.append(f"| (c) update-only samples/s, {variant} (ms per minibatch of 256) | {med(update[variant]):.0f} "
                     f"({256000 / med(update[variant]):.0f} ms) |")  # fmt: skip
    for kind in env2:
        label = "subprocess workers" if kind == "async" else "ale_py vector env"
        lines.append(f"| (a2) env-only steps/s, 2 processes of 4 envs at once, {label} | {med(env2[kind]):.0f} |")
    for variant in two_proc:
        lines.append(f"| (b2) inference, {variant}, 2 processes of 4 envs at once: env steps/s | "
                     f"{med(infer2[variant]):.0f} |")  # fmt: skip
    for variant in two_proc:
        lines.append(f"| (c2) update-only, {variant}, 2 processes with minibatches of 128 at once: samples/s | "
                     f"{med(update2[variant]):.0f} |")  # fmt: skip
    table_parts = "\n".join(lines)
    rows = ["| script | processes | flags | training SPS | sequential bound | ratio | bound, parts as 2 processes "
            "| ratio |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    chart = []
    for config in configs:
        script, nproc, variant, groups = config
        sps = med(train[config])
        if variant is None:
            rows.append(
                f"| {script} | 1 | (none: fp32) | {sps:.0f} | {bound('fp32'):.0f} | {sps / bound('fp32'):.2f} | - | - |"
            )
            chart.append((f"{script[:-3]} fp32", sps, bound("fp32")))
            continue
        flags = " ".join([*VARIANTS[variant][4], "--env-groups", str(groups)])
        second = f"{bound(variant, 2):.0f} | {sps / bound(variant, 2):.2f}" if nproc == 2 else "- | -"
        rows.append(
            f"| {script} | {nproc} | `{flags}` | {sps:.0f} | {bound(variant):.0f} | {sps / bound(variant):.2f} "
            f"| {second} |"
        )
        short = "multigpu" if "multigpu" in script else "ppo_atari"
        label = variant.replace("channels_last", "CL").replace("compile", "cmp")
        chart.append((f"{short} x{nproc} {label} g{groups}", sps, bound(variant)))
    table_train = "\n".join(rows)
    print(table_parts + "\n\n" + table_train)
    if opts.out:
        write_report(opts, table_parts, table_train, chart)


def write_report(opts, table_parts, table_train, chart):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    png = Path(opts.out).with_suffix(".png")
    fig, ax = plt.subplots(figsize=(max(6.4, 0.55 * len(chart)), 4.2))
    xs = np.arange(len(chart))
    ax.bar(xs, [c[1] for c in chart], color="tab:blue", label="training SPS")
    ax.scatter(xs, [c[2] for c in chart], color="tab:red", marker="_", s=400, label="sequential bound", zorder=3)
    ax.set_xticks(xs, [c[0] for c in chart], fontsize=7, rotation=60, ha="right")
    ax.set_ylabel("env steps / s")
    ax.set_title("Atari PPO training SPS against the sequential bound")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU, torch {torch.__version__}, "
               f"Python {platform.python_version()}")  # fmt: skip
    command = (f"python benchmark/throughput.py --reps {opts.reps} --iterations {opts.iterations} --variants "
               f"{' '.join(opts.variants)} --env-groups {' '.join(map(str, opts.env_groups))} --overlap-variants "
               f"{' '.join(opts.overlap_variants)} --out {opts.out}")  # fmt: skip
    # The reading written by hand below the measured tables (from "## What was kept" on) is kept.
    analysis = ""
    if Path(opts.out).exists():
        previous = Path(opts.out).read_text()
        if ANALYSIS_HEADING in previous:
            analysis = "\n" + previous[previous.index(ANALYSIS_HEADING) :]
    Path(opts.out).write_text(
        "# Throughput of the Atari PPO training loop\n\n"
        f"Measured {time.strftime('%Y-%m-%d')} on {machine}; medians of {opts.reps} interleaved repetitions.\n\n"
        f"```bash\n{command}\n```\n\n"
        "## The parts\n\n" + table_parts + "\n\n"
        "## Training against the sequential bound\n\n"
        f"Runs: `{' '.join(TRAIN)} --num-envs 8 --total-timesteps {1024 * opts.iterations}` plus the flags below "
        "(global batch 1024: 8 envs in all, whatever the number of processes; one torch thread per process "
        "under torchrun on 2 cores). The bound of a row uses the env rate of the row's env backend and the "
        "inference and update rates of the row's layout, precision and compilation; `--env-groups 2` overlaps the "
        "emulators of one half of the envs with the inference of the other half, which the bound does not allow "
        "for. The second bound of a 2-process row uses the parts measured as 2 processes at once, (a2) to (c2). "
        "Training SPS is the steady state: from the end of the first iteration (which includes torch.compile's "
        "compilation) to the end of the last.\n\n"
        + table_train
        + f"\n\n![training SPS vs bound]({png.name})\n"
        + analysis
    )


if __name__ == "__main__":
    main()
