"""--upload-model: the folder and model card that go to the Hugging Face Hub (the Hub itself is unreachable here)."""

from __future__ import annotations

import json
import os
import time

import imageio
import pytest

from cleanrl_utils.huggingface import build_upload_folder, newest_video, repo_name
from conftest import free_port, only_run_dir, read_scalars, run_script


def test_repo_name_is_a_valid_hub_name():
    assert repo_name("CartPole-v1", "ppo", 1) == "CartPole-v1-ppo-seed1"
    assert repo_name("ALE/Pong-v5", "ppo_atari", 3) == "ALE-Pong-v5-ppo_atari-seed3"


def test_folder_holds_model_script_flags_card_and_newest_video(tmp_path):
    model = tmp_path / "dqn.cleanrl_model"
    model.write_bytes(b"weights")
    script = tmp_path / "dqn.py"
    script.write_text("print('train')\n")
    videos = tmp_path / "videos"
    videos.mkdir()
    (videos / "old.mp4").write_bytes(b"old")
    os.utime(videos / "old.mp4", (time.time() - 100, time.time() - 100))
    (videos / "new.mp4").write_bytes(b"new")
    args = {"env_id": "CartPole-v1", "exp_name": "dqn", "seed": 7, "total_timesteps": 1000, "hf_entity": "me"}
    folder = build_upload_folder(str(tmp_path / "hf"), "me/CartPole-v1-dqn-seed7", str(model), str(script), args,
                                 [10.0, 20.0, 30.0], video_dirs=[str(tmp_path / "none"), str(videos)])  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "args.json", "dqn.cleanrl_model", "dqn.py",
                                                        "replay.mp4"]  # fmt: skip
    assert (folder / "replay.mp4").read_bytes() == b"new"
    assert json.loads((folder / "args.json").read_text())["seed"] == 7
    card = (folder / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: cleanrl" in card
    assert "value: 20.00 +/- 8.16" in card and "**20.00 +/- 8.16** over 3 episodes" in card
    assert "--model-path me/CartPole-v1-dqn-seed7" in card
    assert newest_video([str(tmp_path / "none")]) is None


@pytest.mark.parametrize(
    "script,flags", [("ppo.py", ["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "64"])]
)
def test_upload_model_builds_the_folder_then_reports_the_failed_upload(script, flags, workdir):
    # Nothing listens on this port: every upload attempt fails at once, as with no network.
    hub = f"http://127.0.0.1:{free_port()}"
    proc = run_script(
        script,
        [*flags, "--save-model", "--upload-model", "--hf-entity", "tester", "--capture-video", "--eval-episodes", "2"],
        workdir, HF_ENDPOINT=hub, HF_HOME=str(workdir / "hf_home"), HF_TOKEN="hf_dummy",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    run_dir = only_run_dir(workdir)
    folder = run_dir / "hf_upload"
    assert len(errors) == 1 and str(folder.relative_to(workdir)) in errors[0] and "retry with" in errors[0]
    assert "tester/CartPole-v1-ppo-seed1" in errors[0]
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["README.md", "args.json", "ppo.cleanrl_model", "ppo.py", "replay.mp4"]
    evals = [value for _, value in read_scalars(run_dir)["eval/episodic_return"]]
    card = (folder / "README.md").read_text()
    mean = sum(evals) / len(evals)
    assert f"**{mean:.2f} +/-" in card and "over 2 episodes" in card
    with imageio.get_reader(str(folder / "replay.mp4"), "ffmpeg") as reader:
        assert sum(1 for _ in reader) > 1


def test_upload_model_needs_save_model(workdir):
    proc = run_script("dqn.py", ["--upload-model"], workdir)
    assert proc.returncode == 2 and "add --save-model" in proc.stderr
    assert not (workdir / "runs").exists()
