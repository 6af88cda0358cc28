"""--track logs the same scalars to Weights & Biases (offline here) without the shutdown stall."""

from __future__ import annotations

import glob

from conftest import check_ok, only_run_dir, read_scalars, run_script


def test_track_writes_offline_wandb_run_with_scalars(workdir):
    flags = ["--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "128", "--track"]
    proc = run_script("ppo.py", flags, workdir, WANDB_MODE="offline")
    check_ok(proc)
    run_files = glob.glob(str(workdir / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(run_files) == 1, run_files
    data = open(run_files[0], "rb").read()
    # The run's history records carry the TensorBoard tags as keys; one SPS value per iteration.
    iterations = 2048 // (4 * 128)
    assert data.count(b"charts/SPS") >= iterations
    for tag in (b"charts/episodic_return", b"losses/value_loss", b"losses/approx_kl", b"global_step"):
        assert tag in data, tag
    # TensorBoard output is still written as usual.
    assert "charts/SPS" in read_scalars(only_run_dir(workdir))
