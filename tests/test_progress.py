"""The progress display: a live bar on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

from cleanrl_utils.progress import Progress, format_duration
from conftest import SCRIPTS, check_ok, run_script, script_env


def test_plain_lines_with_steps_sps_eta_and_mean_return():
    out = io.StringIO()
    progress = Progress(1000, interval=0.0, stream=out)
    progress.update(100)
    progress.episode(10.0)
    progress.episode(20.0)
    progress.update(500)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()
    assert lines[0].startswith("global_step=100/1000 (10%) SPS=") and "ETA=" in lines[0]
    assert "mean_return" not in lines[0]
    assert lines[1].startswith("global_step=500/1000 (50%)") and lines[1].endswith("mean_return(last 2)=15.0")


def test_plain_lines_are_rate_limited_and_close_prints_the_final_state_once():
    out = io.StringIO()
    progress = Progress(1000, interval=3600, stream=out)
    for step in range(0, 1001, 10):
        progress.update(step)
    assert out.getvalue() == ""  # an hour between lines: nothing yet
    progress.close()
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("global_step=1000/1000 (100%)")


def test_resumed_run_measures_speed_from_where_it_resumed():
    out = io.StringIO()
    progress = Progress(1000, start_step=900, interval=0.0, stream=out)
    progress.start_time -= 10.0  # 10 s after the resume
    progress.update(950)
    assert "SPS=5 " in out.getvalue() and "ETA=10s" in out.getvalue()


def test_live_bar_redraws_in_place_and_ends_the_line():
    out = io.StringIO()
    progress = Progress(100, stream=out, live=True)
    progress.update(50, force=True)
    progress.close()
    text = out.getvalue()
    assert text.startswith("\r[############............] global_step=50/100")
    assert text.endswith("\n") and text.count("\n") == 1


def test_disabled_progress_writes_nothing():
    out = io.StringIO()
    progress = Progress(100, stream=out, interval=0.0, enabled=False)
    progress.update(50)
    progress.close()
    assert out.getvalue() == ""


def test_format_duration():
    assert [format_duration(s) for s in (5, 65, 3725, -3)] == ["5s", "1m05s", "1h02m", "0s"]


FLAGS = ["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "128"]


def test_script_prints_plain_progress_lines_when_piped(workdir):
    proc = run_script("ppo.py", FLAGS, workdir)
    check_ok(proc)
    assert "global_step=128/128 (100%) SPS=" in proc.stdout
    assert "\r" not in proc.stdout


def test_script_draws_a_live_bar_on_a_terminal(workdir):
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "ppo.py"), *FLAGS],
        cwd=workdir, env=script_env(), stdin=subprocess.DEVNULL, stdout=child, stderr=child,
    )  # fmt: skip
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # the child side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert proc.wait(timeout=300) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert "\r[" in text and "global_step=128/128 (100%)" in text and "] global_step=" in text
