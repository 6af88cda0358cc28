"""DDPG, TD3 and SAC: steps and wall time to a mean return of -250 on Pendulum-v1, and MuJoCo SPS.

Part 1 runs each script once per seed on Pendulum-v1 with the flags of
tests/test_offpolicy_actor_critic.py's learning test (sequentially, one torch thread each) and
reports the first global step at which the mean of the last 10 episodic returns is >= -250, the
wall time to that point, and the mean of the last 10 episodes at the end of the budget.

Part 2 runs each script for a short budget on a MuJoCo task with the default (paper-sized)
networks and reports the training SPS after --learning-starts, i.e. with one gradient step per
environment step, the regime of a full run.

    python benchmark/offpolicy_continuous.py --seeds 1 2 3 --out docs/benchmarks/offpolicy_continuous.md \\
        --plot-dir docs/benchmarks/offpolicy_pendulum
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ["ddpg_continuous_action.py", "td3_continuous_action.py", "sac_continuous_action.py"]
# The learning test's flags: 64-wide networks, batches of 128 (CPU-friendly; Pendulum needs no more).
PENDULUM = {
    "ddpg_continuous_action.py": "--env-id Pendulum-v1 --total-timesteps 30000 --hidden-size 64 --batch-size 128 "
    "--learning-starts 1000 --learning-rate 1e-3",
    "td3_continuous_action.py": "--env-id Pendulum-v1 --total-timesteps 20000 --hidden-size 64 --batch-size 128 "
    "--learning-starts 1000 --learning-rate 1e-3",
    "sac_continuous_action.py": "--env-id Pendulum-v1 --total-timesteps 20000 --hidden-size 64 --batch-size 128 "
    "--learning-starts 1000",
}
BAR = {"ddpg_continuous_action.py": 30_000, "td3_continuous_action.py": 20_000, "sac_continuous_action.py": 20_000}


def scalars(tmp: str, tag: str):
    acc = EventAccumulator(glob.glob(f"{tmp}/runs/*")[0], size_guidance={"scalars": 0})
    acc.Reload()
    return acc.Scalars(tag)


def pendulum(script: str, seed: int, work_dir: str):
    # The runs are kept (one folder per script and seed) so that cleanrl_utils.plot can draw them.
    tmp = os.path.join(work_dir, f"{script[:-3]}_{seed}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    start = time.time()
    cmd = [sys.executable, str(REPO / "cleanrl" / script), *PENDULUM[script].split(), "--seed", str(seed)]
    cmd.append("--no-cuda")
    subprocess.run(cmd, cwd=tmp, env=dict(os.environ, OMP_NUM_THREADS="1"), check=True, stdout=subprocess.DEVNULL)
    total = time.time() - start
    events = scalars(tmp, "charts/episodic_return")
    final = sum(e.value for e in events[-10:]) / 10
    for i in range(9, len(events)):
        if sum(e.value for e in events[i - 9 : i + 1]) / 10 >= -250:
            return events[i].step, events[i].wall_time - start, final, total
    return None, None, final, total


def mujoco_sps(script: str, env_id: str, steps: int, learning_starts: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(REPO / "cleanrl" / script), "--env-id", env_id, "--total-timesteps", str(steps),
               "--learning-starts", str(learning_starts), "--no-cuda"]  # fmt: skip
        subprocess.run(cmd, cwd=tmp, env=dict(os.environ, OMP_NUM_THREADS="1"), check=True, stdout=subprocess.DEVNULL)
        events = scalars(tmp, "losses/qf1_loss")
        # Rate over the training part only: the random warm-up steps cost no gradient step.
        first, last = events[0], events[-1]
        return (last.step - first.step) / (last.wall_time - first.wall_time)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", nargs="+", default=SCRIPTS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--mujoco-env", default="Hopper-v5")
    parser.add_argument("--mujoco-steps", type=int, default=3000)
    parser.add_argument("--out", type=str, default=None, help="also write the tables to this markdown file")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "offpolicy_continuous"))
    parser.add_argument("--plot-dir", default=None, help="draw the Pendulum curves here with cleanrl_utils.plot")
    opts = parser.parse_args()
    rows = [
        "| script | seed | steps to -250 | wall time to -250 (s) | mean of last 10 at the end | whole run (s) |",
        "|---|---|---|---|---|---|",
    ]
    for script in opts.scripts:
        steps, times = [], []
        for seed in opts.seeds:
            step, seconds, final, total = pendulum(script, seed, opts.work_dir)
            reached = f"{step} | {seconds:.1f}" if step else "not reached | -"
            rows.append(f"| {script} | {seed} | {reached} | {final:.1f} | {total:.1f} |")
            print(rows[-1], flush=True)
            if step:
                steps.append(step)
                times.append(seconds)
        if steps:
            median = f"**{int(statistics.median(steps))}** (bar: {BAR[script]:,})"
            rows.append(f"| **{script} median** | | {median} | **{statistics.median(times):.1f}** | | |")
    sps_rows = ["| script | env | training SPS (one gradient step per env step) |", "|---|---|---|"]
    for script in opts.scripts:
        sps = mujoco_sps(script, opts.mujoco_env, opts.mujoco_steps, opts.mujoco_steps // 3)
        sps_rows.append(f"| {script} | {opts.mujoco_env} | {sps:.0f} |")
        print(sps_rows[-1], flush=True)
    table, sps_table = "\n".join(rows), "\n".join(sps_rows)
    if opts.plot_dir:
        from cleanrl_utils.plot import plot_runs

        plot_runs(opts.work_dir, opts.plot_dir, window=5)
        table += f"\n\n![Pendulum-v1 learning curves]({os.path.basename(opts.plot_dir)}/Pendulum-v1.png)"
    print(table + "\n\n" + sps_table)
    if opts.out:
        machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
        pendulum_cmds = "\n".join(f"python cleanrl/{s} {PENDULUM[s]} --seed SEED" for s in opts.scripts)
        full_cmds = "\n".join(
            f"for seed in 1 2 3; do python cleanrl/{s} --env-id {env} --seed $seed --track; done"
            for s in opts.scripts
            for env in ("Hopper-v5", "HalfCheetah-v5", "Walker2d-v5")
        )
        Path(opts.out).write_text(
            "# DDPG, TD3 and SAC: Pendulum-v1 learning and MuJoCo throughput\n\n"
            f"Measured {time.strftime('%Y-%m-%d')} on {machine}, no GPU, one torch thread, runs one after another.\n\n"
            "Command:\n\n```bash\npython benchmark/offpolicy_continuous.py --scripts "
            + " ".join(opts.scripts)
            + " --seeds "
            + " ".join(map(str, opts.seeds))
            + f" --mujoco-env {opts.mujoco_env} --mujoco-steps {opts.mujoco_steps} --out {opts.out}"
            + (f" --plot-dir {opts.plot_dir}" if opts.plot_dir else "")
            + "\n```\n\n"
            f"## Pendulum-v1\n\nPer seed:\n\n```bash\n{pendulum_cmds}\n```\n\n"
            '"Steps to -250" is the first `global_step` at which the mean of the last 10 episodic returns is '
            ">= -250 (the learning test's bar: 20,000 steps for TD3 and SAC, 30,000 for DDPG). Wall time counts "
            "from process start (imports included) to the TensorBoard event of that episode.\n\n" + table + "\n\n"
            f"## {opts.mujoco_env}, default networks (256x256, batch 256)\n\n"
            f"{opts.mujoco_steps} steps with `--learning-starts {opts.mujoco_steps // 3}`; SPS measured between the "
            "first and the last logged loss, so it is the rate of the training phase.\n\n" + sps_table + "\n\n"
            "## Full runs (1M steps, 3 seeds) on a GPU machine\n\nThe defaults are the papers' settings for MuJoCo "
            "(1M steps, 256x256 networks, batch 256, 25k random warm-up steps for DDPG/TD3, 5k for SAC):\n\n"
            f"```bash\n{full_cmds}\n```\n\nAt the CPU rate above a 1M-step run would take days; on a GPU the "
            "update is no longer the bottleneck. Add `--checkpoint-frequency 100000 --run-name NAME` and "
            "`--resume auto` to survive preemption.\n"
        )


if __name__ == "__main__":
    main()
