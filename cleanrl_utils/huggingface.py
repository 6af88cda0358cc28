"""Publish a trained model on the Hugging Face Hub (``--upload-model``).

A script run with ``--save-model --upload-model [--hf-entity ENTITY]`` ends by calling
``push_run``: it builds ``runs/<run_name>/hf_upload/`` with

- ``<exp_name>.cleanrl_model`` - the saved model (loadable with ``torch.load(weights_only=True)``),
- ``<script>.py`` - the script that trained it, ``args.json`` - every flag,
- ``README.md`` - a model card with the evaluation returns (mean +- std over the episodes) and the
  commands to reproduce and to watch the agent,
- ``replay.mp4`` - the newest video of the run (evaluation episodes first) if videos were captured,

and uploads that folder to the model repository ``{entity}/{env_id}-{exp_name}-seed{seed}``,
retrying a few times. The folder stays on disk whatever happens: if the upload fails, the error
says how to retry it alone::

    python -m cleanrl_utils.huggingface --folder runs/<run_name>/hf_upload --repo-id ENTITY/NAME

The upload itself (``upload_folder``) is the only part that needs the network and a token
(``huggingface-cli login`` or ``HF_TOKEN``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path


class HubUploadError(Exception):
    pass


def repo_name(env_id: str, exp_name: str, seed: int) -> str:
    # Repository names cannot hold "/" (ALE/Pong-v5) or ":" (module:Env ids).
    return f"{env_id}-{exp_name}-seed{seed}".replace("/", "-").replace(":", "-")


def newest_video(video_dirs: list[str]) -> str | None:
    """The most recent mp4 of the first folder that has one."""
    for folder in video_dirs:
        videos = glob.glob(os.path.join(folder, "*.mp4"))
        if videos:
            return max(videos, key=os.path.getmtime)
    return None


def model_card(repo_id: str, script: str, args: dict, episodic_returns: list[float]) -> str:
    mean = statistics.fmean(episodic_returns) if episodic_returns else float("nan")
    std = statistics.pstdev(episodic_returns) if episodic_returns else float("nan")
    env_id, exp_name = args["env_id"], args["exp_name"]
    flags = " ".join(
        f"--{key.replace('_', '-')} {value}"
        for key, value in args.items()
        if key in ("env_id", "seed", "total_timesteps") and value is not None
    )
    return f"""---
tags:
- {env_id}
- deep-reinforcement-learning
- reinforcement-learning
- custom-implementation
library_name: cleanrl
model-index:
- name: {script}
  results:
  - task:
      type: reinforcement-learning
      name: reinforcement-learning
    dataset:
      name: {env_id}
      type: {env_id}
    metrics:
    - type: mean_reward
      value: {mean:.2f} +/- {std:.2f}
      name: mean_reward
      verified: false
---

# {script} on {env_id}

A `{script}.py` agent trained with the cleanrl-torchrun scripts (experiment `{exp_name}`, seed
{args.get("seed")}, {args.get("total_timesteps")} environment steps).

## Evaluation

Mean episodic return **{mean:.2f} +/- {std:.2f}** over {len(episodic_returns)} episodes.
Episodic returns: {", ".join(f"{r:.2f}" for r in episodic_returns)}

## Watch it

```bash
python -m cleanrl_utils.enjoy --exp-name {script} --model-path {repo_id} --eval-episodes 10
```

## Train it again

```bash
python cleanrl/{script}.py {flags}
```

Every flag of the run is in `args.json`; the script that trained the model is `{script}.py`.
"""


def build_upload_folder(
    folder: str,
    repo_id: str,
    model_path: str,
    script_path: str,
    args: dict,
    episodic_returns: list[float],
    video_dirs: list[str] = (),
) -> Path:
    """Write everything that goes to the Hub into ``folder`` (replacing what a previous call left)."""
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    script = Path(script_path).stem
    shutil.copy2(model_path, folder / Path(model_path).name)
    shutil.copy2(script_path, folder / f"{script}.py")
    (folder / "args.json").write_text(json.dumps(args, indent=2, default=str) + "\n")
    (folder / "README.md").write_text(model_card(repo_id, script, args, episodic_returns))
    video = newest_video(list(video_dirs))
    if video:
        shutil.copy2(video, folder / "replay.mp4")
    return folder


def upload_folder(folder: str, repo_id: str, retries: int = 3, backoff: float = 1.0) -> str:
    """Create the repository if needed and upload the folder; retry transient failures. Returns the URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    last_error: Exception | None = None
    for attempt in range(retries):
        try:
            api.create_repo(repo_id=repo_id, repo_type="model", exist_ok=True)
            api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                              commit_message="Upload a cleanrl-torchrun agent")  # fmt: skip
            return f"https://huggingface.co/{repo_id}"
        except Exception as e:  # noqa: BLE001 - network, auth and server errors are all retried the same way
            last_error = e
            if attempt + 1 < retries:
                time.sleep(backoff * 2**attempt)
    raise HubUploadError(f"{type(last_error).__name__}: {last_error}")


def resolve_entity(hf_entity: str) -> str:
    if hf_entity:
        return hf_entity
    from huggingface_hub import HfApi

    try:
        return HfApi().whoami()["name"]
    except Exception as e:  # noqa: BLE001
        raise HubUploadError(f"--hf-entity is empty and the Hub login could not be read ({e})") from e


def push_run(args, run_name: str, model_path: str, episodic_returns: list[float], script_path: str) -> str:
    """What a script runs at its very end with ``--upload-model``: build the folder, upload it, report.

    On failure: one ``error:`` line naming the kept folder and the retry command, exit status 1.
    """
    values = dict(vars(args))
    folder = os.path.join("runs", run_name, "hf_upload")
    name = repo_name(values["env_id"], values["exp_name"], values["seed"])
    try:
        entity = resolve_entity(values.get("hf_entity", ""))
    except HubUploadError as e:
        entity = None
        error = e
    repo_id = f"{entity or '<your-hf-entity>'}/{name}"
    build_upload_folder(folder, repo_id, model_path, script_path, values, episodic_returns,
                        video_dirs=[f"videos/{run_name}-eval", f"videos/{run_name}"])  # fmt: skip
    try:
        if entity is None:
            raise error
        url = upload_folder(folder, repo_id)
    except HubUploadError as e:
        print(
            f"error: upload to the Hugging Face Hub failed ({e}); the model and its card are kept in {folder}; "
            f"retry with: python -m cleanrl_utils.huggingface --folder {folder} --repo-id {repo_id}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    print(f"model uploaded to {url}", flush=True)
    return url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Upload a folder built by --upload-model to the Hugging Face Hub.")
    parser.add_argument("--folder", required=True, help="runs/<run_name>/hf_upload")
    parser.add_argument("--repo-id", required=True, help="ENTITY/NAME")
    opts = parser.parse_args(argv)
    if not os.path.isdir(opts.folder):
        print(f"error: --folder {opts.folder} is not a folder", file=sys.stderr)
        raise SystemExit(2)
    try:
        print(f"model uploaded to {upload_folder(opts.folder, opts.repo_id)}")
    except HubUploadError as e:
        print(f"error: upload to the Hugging Face Hub failed ({e})", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
