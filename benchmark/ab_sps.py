"""Training SPS of a script at two commits, measured side by side (interleaved runs, medians).

    python benchmark/ab_sps.py --base 8e15a6b~1 --nproc 2 --flags="--env-backend ale --bf16" --reps 3

Compares cleanrl/<script> as it is in the working tree with the same file at --base (read with
`git show`, run from a temporary copy against the working tree's cleanrl_utils). The runs use the
throughput benchmark's settings (BreakoutNoFrameskip-v4, 8 envs in all, 128 steps, 4 minibatches,
4 epochs) and its steady-state SPS: from the end of the first iteration to the end of the last.
A change that only rearranges the computation should also end with the same parameters: compare
the `param_sha256` of two short runs for that.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import tempfile
from pathlib import Path

from throughput import REPO, training_sps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (any git revision)")
    parser.add_argument("--script", default="ppo_atari_multigpu.py", help="a script of cleanrl/")
    parser.add_argument("--nproc", type=int, default=2, help="processes (torchrun when more than 1)")
    parser.add_argument("--flags", default="", help="extra flags for both versions, one string")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=6, help="training iterations of 1024 steps per run")
    opts = parser.parse_args()
    show = subprocess.run(["git", "show", f"{opts.base}:cleanrl/{opts.script}"], cwd=REPO, capture_output=True,
                          text=True)  # fmt: skip
    if show.returncode != 0:
        raise SystemExit(f"error: cannot read cleanrl/{opts.script} at {opts.base}: {show.stderr.strip()}")
    flags = shlex.split(opts.flags)
    with tempfile.TemporaryDirectory() as tmp:
        base_copy = Path(tmp) / opts.script
        base_copy.write_text(show.stdout)
        versions = {f"at {opts.base}": base_copy, "working tree": REPO / "cleanrl" / opts.script}
        results = {name: [] for name in versions}
        for rep in range(opts.reps):
            for name, path in versions.items():
                results[name].append(training_sps(path, opts.nproc, flags, opts.iterations))
                print(f"rep {rep}: {name}: {results[name][-1]:.0f} SPS", flush=True)
    print(f"\n{opts.script}, {opts.nproc} process(es), flags: {opts.flags or '(none)'}; medians of {opts.reps}")
    base, new = (statistics.median(v) for v in results.values())
    for name, values in results.items():
        print(f"{name}: {statistics.median(values):.0f} SPS ({', '.join(f'{v:.0f}' for v in values)})")
    print(f"ratio working tree / base: {new / base:.2f}")


if __name__ == "__main__":
    main()
