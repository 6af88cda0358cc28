"""Where one iteration of ppo_atari_multigpu.py spends its time, per process, measured in the real loop.

    python benchmark/loop_breakdown.py --nproc 2 --flags="--env-backend ale --bf16"

Runs a copy of the script with wall-clock marks inserted at fixed places of its loop (each anchor
must be found exactly once, or this script stops), under torchrun with --nproc processes and the
default hyperparameters (8 envs in all, 128 steps, 4 minibatches, 4 epochs) on BreakoutNoFrameskip-v4.
Reports, per rank, the mean seconds per iteration of each phase, the first iteration left out
(warm-up, torch.compile). Time spent waiting for the other ranks shows up inside all_reduce.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "cleanrl" / "ppo_atari_multigpu.py"
TIMER = """
import collections as _collections
_PHASES = _collections.defaultdict(float)
_LAST = [time.perf_counter()]


def _mark(name):
    now = time.perf_counter()
    _PHASES[name] += now - _LAST[0]
    _LAST[0] = now

"""
# (anchor line, mark placed before it, mark placed after it); the anchors are matched with their indentation.
MARKS = [
    ("        finished = []  # (global_step, return, length)", "logging, checkpoint, lr", None),
    ("            global_step += args.num_envs\n", "rollout bookkeeping", None),
    ("                    action, logprob, _, value = acting_agent.get_action_and_value(obs[step, sl])\n", None,
     "inference"),
    ("                group.step_async(action.cpu().numpy())\n", "rollout bookkeeping", "env step (send)"),
    ("                next_obs_np, reward, terminated, truncated, infos = group.step_wait()\n", None, "env step (wait)"),
    ("        with torch.no_grad(), autocast():\n", "rollout bookkeeping", None),
    ("                loss, pg_loss, v_loss, entropy_loss, logratio, ratio = loss_fn(\n", "GAE, shuffling", None),
    ("                optimizer.zero_grad()\n", "forward + loss (minibatch gather included)", None),
    ("                loss.backward()\n", None, "backward"),
    ("                    all_reduce_gradients(agent.parameters(), world_size, grad_buffer, shared_sum)\n", None, "all_reduce (waits included)"),
    ("                optimizer.step()\n", None, "clip + Adam"),
    ("        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()\n", "update bookkeeping", None),
]  # fmt: skip
RESET = "        if iteration == 2:\n            _PHASES.clear()\n"
REPORT = '    print("BREAKDOWN " + json.dumps({"rank": rank, "iterations": completed_iteration - 1, **_PHASES}), flush=True)\n'


def instrumented_source() -> str:
    text = SCRIPT.read_text()
    text = text.replace("\nimport datetime\n", "\nimport datetime\nimport json\n", 1)
    text = text.replace('\n\nif __name__ == "__main__":', TIMER + '\nif __name__ == "__main__":', 1)
    for anchor, before, after in MARKS:
        if text.count(anchor) != 1:
            raise SystemExit(f"error: anchor not found exactly once in {SCRIPT.name}: {anchor.strip()!r}")
        indent = re.match(r"\s*", anchor).group(0)
        new = (f"{indent}_mark({before!r})\n" if before else "") + anchor
        new += f"{indent}_mark({after!r})\n" if after else ""
        text = text.replace(anchor, new, 1)
    first = MARKS[0][0]
    text = text.replace(
        f"        _mark({MARKS[0][1]!r})\n{first}", f"        _mark({MARKS[0][1]!r})\n{RESET}{first}", 1
    )
    anchor = "    # One line per rank; identical checksums"
    if text.count(anchor) != 1:
        raise SystemExit("error: the end-of-run anchor is missing")
    return text.replace(anchor, REPORT + anchor, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--flags", default="", help="extra flags for the script, e.g. '--env-backend ale --bf16'")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / SCRIPT.name
        copy.write_text(instrumented_source())
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={opts.nproc}",
               str(copy), "--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "8", "--no-cuda",
               "--total-timesteps", str(1024 * opts.iterations), "--checkpoint-frequency", "0",
               *shlex.split(opts.flags)]  # fmt: skip
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        if proc.returncode != 0:
            raise SystemExit(f"error: the run failed:\n{proc.stderr[-3000:]}")
    # Ranks print concurrently, so two reports can share a line: match them anywhere in the output.
    found = re.findall(r"BREAKDOWN (\{[^{}]*\})", proc.stdout)
    reports = sorted((json.loads(text) for text in found), key=lambda r: r["rank"])
    phases = [k for k in reports[0] if k not in ("rank", "iterations")]
    print(f"seconds per iteration (1024 env steps in all), {opts.nproc} process(es), flags: {opts.flags or '(none)'}")
    print("| phase | " + " | ".join(f"rank {r['rank']}" for r in reports) + " |")
    print("|---|" + "---|" * len(reports))
    for phase in sorted(phases, key=lambda k: -reports[0][k]):
        print(f"| {phase} | " + " | ".join(f"{r[phase] / r['iterations']:.3f}" for r in reports) + " |")
    totals = [sum(r[k] for k in phases) / r["iterations"] for r in reports]
    print("| **total** | " + " | ".join(f"**{t:.3f}**" for t in totals) + " |")
    print(f"implied SPS: {1024 / max(totals):.0f}")


if __name__ == "__main__":
    main()
