"""Learning curves from TensorBoard event files: one PNG per env, one curve per script, a band over seeds.

    python -m cleanrl_utils.plot --runs runs/ --out docs/plots
    python -m cleanrl_utils.plot --runs runs/ --x wall_time --smooth 10 --tag charts/episodic_return

Every run folder below ``--runs`` (any depth) that holds an event file is one run. Its env id,
script (``exp_name``) and seed come from the ``hyperparameters`` text every script writes, or
else from the folder name ``{env_id}__{exp_name}__{seed}__{time}``. Runs are grouped by env and
script; each group's seeds are interpolated onto a common x grid (global step, or seconds since
the run's first event with ``--x wall_time``) and drawn as the mean with a shaded band of one
standard deviation. ``--smooth N`` first averages each run over a moving window of N points.
The table (``results.md`` next to the PNGs, also printed) gives the final return per group: the
mean of each seed's last ``--last-n`` values, then mean +- std over seeds.
"""

from __future__ import annotations

import argparse
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cleanrl_utils.cli import fail


@dataclass
class Run:
    path: Path
    env_id: str
    exp_name: str
    seed: int
    x: np.ndarray
    y: np.ndarray


def _hyperparameters(acc) -> dict[str, str]:
    """The `|param|value|` markdown table a script logs as text, as a dict."""
    for tag in acc.Tags().get("tensors", []):
        if tag.startswith("hyperparameters"):
            events = acc.Tensors(tag)
            if events:
                text = events[0].tensor_proto.string_val[0].decode()
                return dict(re.findall(r"^\|([^|]+)\|([^|]*)\|$", text, re.M))
    return {}


def read_run(path: Path, tag: str, x_axis: str) -> Run | None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    if tag not in acc.Tags().get("scalars", []):
        return None
    events = acc.Scalars(tag)
    params = _hyperparameters(acc)
    parts = path.name.split("__")
    env_id = params.get("env_id") or (parts[0] if len(parts) >= 4 else "unknown-env")
    exp_name = params.get("exp_name") or (parts[1] if len(parts) >= 4 else path.name)
    seed_text = params.get("seed") or (parts[2] if len(parts) >= 4 else "0")
    seed = int(seed_text) if seed_text.lstrip("-").isdigit() else 0
    if x_axis == "wall_time":
        x = np.array([e.wall_time for e in events]) - events[0].wall_time
    else:
        x = np.array([e.step for e in events], dtype=np.float64)
    return Run(path, env_id, exp_name, seed, x, np.array([e.value for e in events], dtype=np.float64))


def find_runs(root: Path, tag: str, x_axis: str) -> list[Run]:
    folders = sorted({Path(dirpath) for dirpath, _, files in os.walk(root) if any("tfevents" in f for f in files)})
    runs = [read_run(folder, tag, x_axis) for folder in folders]
    return [run for run in runs if run is not None and len(run.x) > 0]


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or len(y) < 2:
        return y
    window = min(window, len(y))
    # A trailing moving average that uses fewer points at the start instead of padding.
    cumsum = np.cumsum(np.insert(y, 0, 0.0))
    counts = np.minimum(np.arange(1, len(y) + 1), window)
    return (cumsum[1:] - cumsum[np.arange(1, len(y) + 1) - counts]) / counts


def aggregate(runs: list[Run], window: int, points: int = 200):
    """Mean and std over the runs on a shared grid (where every run has data)."""
    start = max(run.x[0] for run in runs)
    end = min(run.x[-1] for run in runs)
    if end <= start:  # a single point each, or no overlap: fall back to the union of x values
        start, end = min(run.x[0] for run in runs), max(run.x[-1] for run in runs)
    grid = np.linspace(start, end, points) if end > start else np.array([start])
    ys = np.stack([np.interp(grid, run.x, smooth(run.y, window)) for run in runs])
    return grid, ys.mean(0), ys.std(0)


def plot_runs(
    runs_dir: str,
    out_dir: str,
    tag: str = "charts/episodic_return",
    x_axis: str = "global_step",
    window: int = 1,
    last_n: int = 10,
) -> dict:
    """Write ``<out_dir>/<env>.png`` per env and ``<out_dir>/results.md``; return what was drawn."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    runs = find_runs(Path(runs_dir), tag, x_axis)
    if not runs:
        raise FileNotFoundError(f"no run under {runs_dir} has the scalar {tag}")
    groups: dict[str, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        groups[run.env_id][run.exp_name].append(run)
    os.makedirs(out_dir, exist_ok=True)
    summary = {"figures": {}, "curves": {}, "table": ""}
    rows = ["| env | script | seeds | final return (mean +- std) |", "|---|---|---|---|"]
    for env_id in sorted(groups):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for exp_name in sorted(groups[env_id]):
            members = sorted(groups[env_id][exp_name], key=lambda run: run.seed)
            grid, mean, std = aggregate(members, window)
            (line,) = ax.plot(grid, mean, label=f"{exp_name} ({len(members)} seeds)")
            ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
            finals = np.array([run.y[-last_n:].mean() for run in members])
            rows.append(f"| {env_id} | {exp_name} | {len(members)} | {finals.mean():.2f} +- {finals.std():.2f} |")
        ax.set_title(env_id)
        ax.set_xlabel("global step" if x_axis == "global_step" else "wall time (s)")
        ax.set_ylabel(tag)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        path = os.path.join(out_dir, env_id.replace("/", "_") + ".png")
        fig.savefig(path, dpi=100)
        summary["figures"][env_id] = path
        summary["curves"][env_id] = [line.get_label() for line in ax.get_lines()]
        plt.close(fig)
    summary["table"] = "\n".join(rows) + "\n"
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(f"# Final returns ({tag}, mean of the last {last_n} values per seed)\n\n" + summary["table"])
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs", help="the folder holding the run folders (searched recursively)")
    parser.add_argument("--out", default="plots", help="where the PNGs and results.md go")
    parser.add_argument("--tag", default="charts/episodic_return", help="the scalar to plot")
    parser.add_argument("--x", default="global_step", choices=["global_step", "wall_time"], help="the x axis")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in points (1: none)")
    parser.add_argument("--last-n", type=int, default=10, help="values per seed averaged for the final return")
    opts = parser.parse_args(argv)
    if not os.path.isdir(opts.runs):
        fail(f"--runs {opts.runs} is not a folder")
    if opts.smooth < 1 or opts.last_n < 1:
        fail("--smooth and --last-n must be >= 1")
    try:
        summary = plot_runs(opts.runs, opts.out, opts.tag, opts.x, opts.smooth, opts.last_n)
    except FileNotFoundError as e:
        fail(str(e))
    for env_id, path in summary["figures"].items():
        print(f"{path}: {len(summary['curves'][env_id])} curves ({', '.join(summary['curves'][env_id])})")
    print(summary["table"], end="")
    return summary


if __name__ == "__main__":
    main()
