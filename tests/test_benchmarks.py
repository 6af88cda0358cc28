"""The benchmark scripts behind docs/benchmarks/ still run: tiny budgets, the shape of what they write."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, script_env

BENCH = REPO / "benchmark"


def run_bench(script: str, args: list[str], cwd: Path, timeout: float = 600, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=cwd,
        env=script_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def bench(script: str, args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = run_bench(script, args, cwd, timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_throughput_writes_the_parts_the_bound_and_the_ratios(tmp_path):
    out = tmp_path / "throughput.md"
    variant = "bf16+channels_last+ale"
    bench("throughput.py", ["--reps", "1", "--iterations", "2", "--variants", variant, "--env-groups", "1",
                            "--overlap-variants", variant, "--out", str(out)], tmp_path)  # fmt: skip
    doc = out.read_text()
    for part in ("(a) env-only steps/s", "(b) inference", "(c) update-only samples/s", "(a2)", "(b2)", "(c2)"):
        assert re.search(rf"^\| {re.escape(part)}.* \| \d+", doc, re.M), (part, doc)
    # One training row per script and process count, each with its bound and a ratio to it.
    rows = re.findall(
        r"^\| (ppo_atari(?:_multigpu)?\.py) \| (\d) \| `([^`]*)` \| (\d+) \| (\d+) \| (\d\.\d\d) \|", doc, re.M
    )
    layouts = {(script, nproc) for script, nproc, *_ in rows}
    assert layouts == {("ppo_atari_multigpu.py", "1"), ("ppo_atari_multigpu.py", "2"), ("ppo_atari.py", "1")}, doc
    assert {flags.split("--env-groups ")[1] for _, _, flags, *_ in rows} == {"1", "2"}
    for _, _, _, sps, bound, ratio in rows:
        # The ratio is of the unrounded rates; the table shows them rounded to integers and it to 2 decimals.
        sps, bound, ratio = int(sps), int(bound), float(ratio)
        assert sps > 0 and (sps - 0.5) / (bound + 0.5) - 0.005 <= ratio <= (sps + 0.5) / (bound - 0.5) + 0.005
    assert (tmp_path / "throughput.png").stat().st_size > 1000


def test_loop_breakdown_accounts_for_the_iteration_of_every_rank(tmp_path):
    proc = bench(
        "loop_breakdown.py", ["--nproc", "2", "--iterations", "2", "--flags=--env-backend ale --bf16"], tmp_path
    )
    total = re.search(r"^\| \*\*total\*\* \| \*\*([\d.]+)\*\* \| \*\*([\d.]+)\*\* \|$", proc.stdout, re.M)
    assert total and float(total[1]) > 0 and float(total[2]) > 0, proc.stdout
    for phase in ("backward", "inference", "all_reduce (waits included)", "env step (wait)"):
        assert f"| {phase} |" in proc.stdout
    assert re.search(r"^implied SPS: \d+$", proc.stdout, re.M)


def test_scaling_model_covers_1_to_8_nodes_from_the_measured_allreduce(tmp_path):
    out = tmp_path / "scaling.md"
    bench("scaling_model.py", ["--allreduce", str(REPO / "docs" / "benchmarks" / "allreduce_scaling.json"),
                               "--env-per-core", "770", "--update-per-core", "1300", "--out", str(out)], tmp_path)  # fmt: skip
    doc = out.read_text()
    assert "6,746,772 (the gradient)" in doc
    # Every modelled network: a table of 1, 2, 4 and 8 nodes x 1, 2, 4 and 8 GPUs, SPS with its communication share.
    tables = re.findall(r"^\| nodes \\ GPUs per node \| 1 \| 2 \| 4 \| 8 \|\n\|.*\n((?:\| \d \|.*\n)+)", doc, re.M)
    assert len(tables) >= 6, doc
    for table in tables:
        lines = table.strip().splitlines()
        assert [line.split(" | ")[0] for line in lines] == ["| 1", "| 2", "| 4", "| 8"], table
        assert all(len(re.findall(r"[\d.]+k \(\d+%\)", line)) == 4 for line in lines), table
    assert "## The article's claim: more than 100k environment steps/s on 8 nodes" in doc


@pytest.mark.parametrize("script", ["allreduce_scaling.py", "allreduce_buffer.py", "allreduce_vs_ddp.py"])
def test_collective_benchmarks_outside_torchrun_say_so_in_one_line(script, tmp_path):
    env = {k: v for k, v in script_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = run_bench(script, [], tmp_path, timeout=60, env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: run this under torchrun, e.g. torchrun --standalone --nproc_per_node=2 benchmark/{script}"
    ]


def test_learning_equivalence_compares_each_set_with_plain_and_reuses_its_runs(tmp_path):
    args = ["--steps", "2048", "--seeds", "1", "2", "--sets", "plain", "ale_bf16", "--last-n", "2",
            "--work-dir", str(tmp_path / "runs")]  # fmt: skip
    first = bench("learning_equivalence.py", [*args, "--out", str(tmp_path / "le.md")], tmp_path)
    doc = (tmp_path / "le.md").read_text()
    rows = {}
    for name, cells in re.findall(r"^\| `[^`]*` \((\w+)\) \| (.*) \|$", doc, re.M):
        rows[name] = [c.strip() for c in cells.split(" | ")]
    assert set(rows) == {"plain", "ale_bf16"}, doc
    seed_means = {name: [float(c.split(" +- ")[0]) for c in cells[:2]] for name, cells in rows.items()}
    for name, cells in rows.items():
        mean = float(cells[2])
        # Every figure is shown to 2 decimals: each one read back may be 0.005 off.
        assert abs(mean - sum(seed_means[name]) / 2) <= 0.011
        assert abs(float(cells[3].split(" ")[0]) - (mean - float(rows["plain"][2]))) <= 0.016
    assert rows["plain"][3:] == ["+0.00 (0.00)", "0.00"]
    assert (tmp_path / "le" / "BreakoutNoFrameskip-v4.png").stat().st_size > 1000
    # --reuse reads the runs already there instead of training again: the same table, in seconds.
    start = time.monotonic()
    again = bench("learning_equivalence.py", [*args, "--reuse"], tmp_path)
    assert time.monotonic() - start < 30
    table = [line for line in first.stdout.splitlines() if line.startswith("|")]
    assert table and table == [line for line in again.stdout.splitlines() if line.startswith("|")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sets", "ale"], "--sets must include plain"),
        (["--last-n", "1"], "--last-n must be at least 2"),
    ],
)
def test_learning_equivalence_refuses_bad_input_before_training(args, message, tmp_path):
    proc = run_bench("learning_equivalence.py", [*args, "--work-dir", str(tmp_path / "runs")], tmp_path, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr.splitlines()[-1]
    assert not (tmp_path / "runs").exists()


def test_learning_equivalence_stops_on_a_run_with_one_episode(tmp_path):
    # A run that ended a single game has no standard error: one error line, not a StatisticsError.
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "runs" / "plain_1" / "runs" / "short"))
    writer.add_scalar("charts/episodic_return", 3.0, 100)
    writer.close()
    args = ["--steps", "128", "--seeds", "1", "--sets", "plain", "--work-dir", str(tmp_path / "runs"), "--reuse"]
    proc = run_bench("learning_equivalence.py", args, tmp_path, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: the plain run of seed 1 ended 1 episode(s) in 128 steps; give more --steps (a standard error needs two)"
    ]


def test_ppo_sps_quick_records_every_ppo_script_and_the_thread_counts(tmp_path):
    out = tmp_path / "ppo_sps.md"
    bench("ppo_sps.py", ["--quick", "--reps", "1", "--out", str(out)], tmp_path)
    doc = out.read_text()
    rows = dict(re.findall(r"^\| ([\w.]+(?: x\d)?(?:, \d threads?)?) \| `[^`]*` \| [\d,]+ \| ([\d,]+) \|", doc, re.M))
    scripts = ["ppo.py", "ppo_continuous_action.py", "ppo_atari.py", "ppo_atari_multigpu.py x1",
               "ppo_atari_multigpu.py x2", "ppo_atari_lstm.py", "ppo_procgen.py", "ppg_procgen.py"]  # fmt: skip
    threads = [f"ppo_atari_multigpu.py x{n}, {t} thread{'s' if t > 1 else ''}" for n in (1, 2) for t in (1, 2)]
    assert sorted(rows) == sorted(scripts + threads), doc
    assert all(int(sps.replace(",", "")) > 0 for sps in rows.values())
    # The page says which thread count the default rule picks, for 1 and for 2 processes.
    assert doc.count("the default rule gives") == 2
