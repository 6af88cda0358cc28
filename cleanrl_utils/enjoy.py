"""Watch a trained agent: load a saved model, play N episodes, print the returns, optionally record a video.

    python -m cleanrl_utils.enjoy --exp-name dqn --env-id CartPole-v1 \\
        --model-path runs/CartPole-v1__dqn__1__1700000000/dqn.cleanrl_model --eval-episodes 10 --capture-video

``--model-path`` is a local ``.cleanrl_model`` file or a Hugging Face Hub repository
(``user/CartPole-v1-dqn-seed1``, the name ``--upload-model`` gives it), whose
``<exp-name>.cleanrl_model`` is downloaded. The network class and ``make_env`` come from
``cleanrl/<exp-name>.py`` (imported without running its training), so the agent sees the
preprocessing it was trained with. Videos go to ``videos/<run-name>/``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from cleanrl_utils.cli import fail
from cleanrl_utils.evals import SCRIPTS, ModelFileError, evaluate, load_model_file

SCRIPT_DIR = Path(__file__).resolve().parents[1] / "cleanrl"


def load_script(exp_name: str):
    """Import ``cleanrl/<exp_name>.py`` as a module (its training sits under ``if __name__ == "__main__"``)."""
    path = SCRIPT_DIR / f"{exp_name}.py"
    spec = importlib.util.spec_from_file_location(f"cleanrl_script_{exp_name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file is executed
    spec.loader.exec_module(module)
    return module


def resolve_model_path(model_path: str, exp_name: str) -> str:
    """A local file as is; otherwise ``owner/name`` on the Hugging Face Hub, downloaded to its cache."""
    if os.path.exists(model_path) or model_path.endswith(".cleanrl_model") or model_path.count("/") != 1:
        return model_path
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo_id=model_path, filename=f"{exp_name}.cleanrl_model")
    except Exception as e:  # noqa: BLE001 - network, auth and missing-repo errors all end the same way
        fail(f"could not download {exp_name}.cleanrl_model from the Hugging Face Hub repo {model_path} ({e})")


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exp-name", required=True, choices=sorted(SCRIPTS), help="the script that saved the model")
    parser.add_argument("--model-path", required=True, help="a .cleanrl_model file or a Hugging Face Hub repo id")
    parser.add_argument("--env-id", default=None, help="the environment (default: the one the model trained on)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--capture-video", action="store_true", help="record the episodes to videos/<run-name>/")
    parser.add_argument("--run-name", default=None, help="the video folder name (default: <env>__<exp>__enjoy)")
    parser.add_argument("--epsilon", type=float, default=0.05, help="exploration of the DQN/C51 evaluation")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=False)
    opts = parser.parse_args(argv)
    if opts.eval_episodes < 1:
        fail(f"--eval-episodes must be positive, got {opts.eval_episodes}")
    path = resolve_model_path(opts.model_path, opts.exp_name)
    try:
        saved = load_model_file(path, opts.exp_name)
    except ModelFileError as e:
        fail(str(e))
    env_id = opts.env_id or saved["env_id"]
    run_name = opts.run_name or f"{env_id}__{opts.exp_name}__enjoy"
    module = load_script(opts.exp_name)
    model_class = getattr(module, SCRIPTS[opts.exp_name][1])

    import torch

    device = torch.device("cuda" if opts.cuda and torch.cuda.is_available() else "cpu")
    returns = evaluate(
        path, module.make_env, env_id, opts.eval_episodes, run_name, model_class, device,
        capture_video=opts.capture_video, epsilon=opts.epsilon, seed=opts.seed, script=opts.exp_name,
    )  # fmt: skip
    for i, episodic_return in enumerate(returns):
        print(f"episode={i} episodic_return={episodic_return:.2f}")
    mean, std = float(sum(returns) / len(returns)), float(torch.tensor(returns).std(unbiased=False))
    print(f"{opts.exp_name} on {env_id}: mean return {mean:.2f} +- {std:.2f} over {len(returns)} episodes")
    if opts.capture_video:
        print(f"video: videos/{run_name}/")
    return returns


if __name__ == "__main__":
    main()
