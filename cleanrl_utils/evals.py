"""Evaluate a saved ``.cleanrl_model``: rebuild the network, play N episodes, return their returns.

A model file is the dict a script writes with ``--save-model``: ``script`` (the file name without
``.py``), ``env_id``, ``args`` (every flag), ``model_state_dict`` (the network that acts) and,
for some scripts, extra state such as the observation normalisation. ``evaluate`` is called by
the scripts right after saving and by ``python -m cleanrl_utils.enjoy``; it takes the script's
own ``make_env`` and network class, so an evaluation sees exactly the preprocessing of training.

How each family acts during evaluation (documented, so numbers can be compared):

| family | scripts | action |
|---|---|---|
| q | dqn, c51 (+ _atari) | epsilon-greedy on the Q-values, ``epsilon`` (default 0.05) |
| ppo | ppo, ppo_atari, ppo_atari_multigpu, ppo_procgen, ppg_procgen | sampled from the policy |
| ppo_continuous | ppo_continuous_action | sampled from the Gaussian, on normalised observations, clipped to the bounds |
| ppo_lstm | ppo_atari_lstm | sampled from the policy, the recurrent state carried and reset at episode starts |
| deterministic | ddpg_continuous_action, td3_continuous_action | the actor's action, no exploration noise |
| sac | sac_continuous_action | tanh of the Gaussian's mean (the deterministic policy) |
| sac_discrete | sac_atari | sampled from the policy |
"""

from __future__ import annotations

import os
import random
import types
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

# script -> (family, the class name of the acting network, its constructor kwargs from the saved args)
SCRIPTS: dict[str, tuple[str, str, Callable[[dict], dict]]] = {}


def _register(family, model_class, scripts, kwargs=lambda args: {}):
    for script in scripts:
        SCRIPTS[script] = (family, model_class, kwargs)


def _c51_kwargs(args):
    return {"n_atoms": args["n_atoms"], "v_min": args["v_min"], "v_max": args["v_max"]}


def _hidden_size(args):
    return {"hidden_size": args["hidden_size"]}


_register("q", "QNetwork", ["dqn", "dqn_atari"])
_register("q", "QNetwork", ["c51", "c51_atari"], _c51_kwargs)
_register("ppo", "Agent", ["ppo", "ppo_atari", "ppo_atari_multigpu", "ppo_procgen", "ppg_procgen"])
_register("ppo_continuous", "Agent", ["ppo_continuous_action"])
_register("ppo_lstm", "Agent", ["ppo_atari_lstm"], lambda args: {"lstm_hidden_size": args["lstm_hidden_size"]})
_register("deterministic", "Actor", ["ddpg_continuous_action", "td3_continuous_action"], _hidden_size)
_register("sac", "Actor", ["sac_continuous_action"], _hidden_size)
_register("sac_discrete", "Actor", ["sac_atari"])


# Scripts whose make_env(args, num_envs, seed, evaluation, video_folder) builds a whole vector env (procgen).
VECTOR_MAKE_ENV = {"ppo_procgen", "ppg_procgen"}


class ModelFileError(Exception):
    """The file is not a model this code can evaluate (missing, unreadable, or from another script)."""


def load_model_file(path: str, script: str | None = None) -> dict[str, Any]:
    """Read a ``.cleanrl_model`` safely (tensors only, no pickled code) and check who wrote it."""
    if not os.path.isfile(path):
        raise ModelFileError(f"model file {path} does not exist")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line explanation
        raise ModelFileError(f"{path} is not a readable .cleanrl_model ({type(e).__name__}: {e})") from e
    if not isinstance(saved, dict) or "script" not in saved or "model_state_dict" not in saved:
        raise ModelFileError(f"{path} is not a .cleanrl_model written by a script of this library")
    if script is not None and saved["script"] != script:
        raise ModelFileError(
            f"{path} was saved by {saved['script']}.py, not {script}.py; evaluate it with --exp-name {saved['script']}"
        )
    if saved["script"] not in SCRIPTS:
        raise ModelFileError(f"{path} was saved by {saved['script']}.py, which has no evaluation")
    return saved


def build_model(saved: dict, model_class, envs, device="cpu") -> torch.nn.Module:
    _, _, kwargs = SCRIPTS[saved["script"]]
    model = model_class(envs, **kwargs(saved["args"])).to(device)
    model.load_state_dict(saved["model_state_dict"])
    model.eval()
    return model


def _policy(family: str, model, saved: dict, envs, epsilon: float, device):
    """A function (obs, episode_starts) -> actions for one family; episode_starts matters to recurrent ones."""
    space = envs.single_action_space
    if family == "q":

        def act(obs, _):
            if random.random() < epsilon:
                return envs.action_space.sample()
            x = torch.as_tensor(obs, dtype=torch.float32, device=device)
            return model(x).argmax(dim=1).cpu().numpy()

    elif family in ("ppo", "sac_discrete"):

        def act(obs, _):
            x = torch.as_tensor(obs, dtype=torch.float32, device=device)
            if family == "ppo":
                return model.get_action_and_value(x)[0].cpu().numpy()
            return model.get_action(x)[0].cpu().numpy()

    elif family == "ppo_continuous":
        rms = saved["obs_rms"]
        mean, var = rms["mean"].numpy(), rms["var"].numpy()
        clip = saved["args"]["clip_obs"]

        def act(obs, _):
            # The policy only knows observations normalised with the statistics of its training.
            x = np.clip((obs - mean) / np.sqrt(var + 1e-8), -clip, clip)
            x = torch.as_tensor(x, dtype=torch.float32, device=device)
            return np.clip(model.get_action_and_value(x)[0].cpu().numpy(), space.low, space.high)

    elif family == "ppo_lstm":
        state = {}

        def act(obs, episode_starts):
            if not state:
                state["lstm"] = model.initial_state(len(obs), device)
            x = torch.as_tensor(obs, dtype=torch.float32, device=device)
            done = torch.as_tensor(episode_starts, dtype=torch.float32, device=device)
            action, _, _, _, state["lstm"] = model.get_action_and_value(x, state["lstm"], done)
            return action.cpu().numpy()

    elif family in ("deterministic", "sac"):

        def act(obs, _):
            x = torch.as_tensor(obs, dtype=torch.float32, device=device)
            action = model(x) if family == "deterministic" else model.get_action(x)[2]
            return np.clip(action.cpu().numpy(), space.low, space.high)

    else:
        raise ValueError(f"unknown family {family}")
    return act


def evaluate(
    model_path: str,
    make_env: Callable,
    env_id: str,
    eval_episodes: int,
    run_name: str,
    Model,
    device: str | torch.device = "cpu",
    capture_video: bool = False,
    epsilon: float = 0.05,
    seed: int = 100_000,
    script: str | None = None,
) -> list[float]:
    """Play ``eval_episodes`` episodes of the saved model in one env and return their (unclipped) returns.

    ``make_env(env_id, idx, capture_video, run_name)`` is the script's env factory (a video of the
    episodes goes to ``videos/<run_name>`` with ``capture_video``); for the procgen scripts it is
    ``make_env(args, num_envs, seed, evaluation, video_folder)``, called with the saved flags and
    evaluation levels (the full level distribution). ``Model`` is the acting network class.
    ``script`` (optional) refuses a model file that another script saved.
    """
    saved = load_model_file(model_path, script)
    family = SCRIPTS[saved["script"]][0]
    if saved["script"] in VECTOR_MAKE_ENV:
        env_args = types.SimpleNamespace(**{**saved["args"], "env_id": env_id})
        video_folder = f"videos/{run_name}" if capture_video else None
        envs = make_env(env_args, 1, seed, evaluation=True, video_folder=video_folder)
    else:
        envs = gym.vector.SyncVectorEnv([make_env(env_id, 0, capture_video, run_name)])
    try:
        envs.action_space.seed(seed)
        random.seed(seed)
        torch.manual_seed(seed)
        model = build_model(saved, Model, envs, device)
        act = _policy(family, model, saved, envs, epsilon, device)
        obs, _ = envs.reset(seed=seed)
        episode_starts = np.ones(1, dtype=np.bool_)
        ended = np.zeros(1, dtype=np.bool_)
        returns: list[float] = []
        with torch.no_grad():
            while len(returns) < eval_episodes:
                actions = act(obs, episode_starts)
                obs, _, terminations, truncations, infos = envs.step(actions)
                # Next-step autoreset: the call after an episode end is the reset step (its action is
                # ignored) and returns the first observation of the next episode, where a recurrent
                # policy must start from a fresh state.
                episode_starts, ended = ended, np.logical_or(terminations, truncations)
                if "episode" in infos:
                    returns += [float(r) for r in infos["episode"]["r"][infos["_episode"]]]
    finally:
        envs.close()
    return returns[:eval_episodes]
