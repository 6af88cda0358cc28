"""The benchmark scripts behind docs/benchmarks/ still run: tiny budgets, the shape of what they write."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, script_env

BENCH = REPO / "benchmark"


def bench(script: str, args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=cwd,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
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
        assert int(sps) > 0 and abs(int(sps) / int(bound) - float(ratio)) <= 0.006
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
