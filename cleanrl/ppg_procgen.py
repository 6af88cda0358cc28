"""Phasic Policy Gradient on procgen (StarPilot by default).

PPG (Cobbe et al. 2021) alternates a *policy phase* of ``--n-iteration`` PPO iterations, training a
policy network and a separate value network (the paper's "detached" variant: two IMPALA CNNs that
share nothing) while keeping every frame and value target in a buffer, with an *auxiliary phase* of
``--e-auxiliary`` epochs over that buffer. There the value targets are distilled into an auxiliary
value head on the policy network (so its features learn what the value network knows), a
behaviour-cloning KL to the pre-phase policy, weighted by ``--beta-clone``, keeps the policy where it
was, and the value network trains further. Settings follow the paper (N_pi=32, E_pi=E_V=1, E_aux=6,
beta_clone=1, lr 5e-4), with the reward normalisation and procgen env of ``ppo_procgen.py``.

The buffer holds n_iteration * num_envs * num_steps frames (6.4 GB of uint8 by default) on the
training device. Checkpoints are taken between phases only, when the buffer is empty; a stop signal
during a phase writes the state from the start of that phase, so a resumed run redoes it.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils.checkpoint import (
    EXIT_PREEMPTED,
    CheckpointError,
    StopRequest,
    exit_non_finite,
    find_resume_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from cleanrl_utils.evals import evaluate
from cleanrl_utils.io import atomic_torch_save
from cleanrl_utils.procgen import DISTRIBUTION_MODES, ENV_NAMES, game_name, make_procgen_env, procgen_unavailable_reason
from cleanrl_utils.progress import Progress


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True` and deterministic torch algorithms"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (env 0, `videos/<run_name>`)"""
    save_model: bool = False
    """whether to save the model to `runs/<run_name>/<exp_name>.cleanrl_model` and evaluate it"""
    upload_model: bool = False
    """whether to upload the saved model, its evaluation and video to the Hugging Face Hub (needs --save-model)"""
    hf_entity: str = ""
    """the user or org name of the model repository on the Hugging Face Hub"""
    run_name: str | None = None
    """the run folder under runs/ (default `{env_id}__{exp_name}__{seed}__{unix_time}`)"""
    checkpoint_frequency: int = 3
    """write a checkpoint every N PPG phases to runs/<run_name>/checkpoints (0: only on SIGTERM/SIGINT)"""
    keep_checkpoints: int = 3
    """how many of the newest checkpoints to keep"""
    resume: str | None = None
    """resume from a checkpoint file, or `auto`: the newest checkpoint of --run-name (fresh start if none)"""
    eval_episodes: int = 10
    """episodes of evaluation after --save-model (one per env, on levels of the full distribution)"""

    # Algorithm specific arguments
    env_id: str = "starpilot"
    """the procgen game (`starpilot`, `StarPilot-v0` and `procgen-starpilot-v0` all work)"""
    num_levels: int = 0
    """the number of distinct training levels (0: unbounded, every episode a new level)"""
    start_level: int = 0
    """the first level of the training set when --num-levels > 0"""
    distribution_mode: str = "easy"
    """procgen's difficulty: easy, hard, extreme, memory or exploration"""
    total_timesteps: int = 25000000
    """total timesteps of the experiment (rounded down to whole PPG phases)"""
    learning_rate: float = 5e-4
    """the learning rate of the optimizer (both phases)"""
    num_envs: int = 64
    """the number of parallel game environments"""
    num_steps: int = 256
    """the number of steps to run in each environment per policy rollout"""
    gamma: float = 0.999
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches of a policy-phase epoch"""
    update_epochs: int = 1
    """E_pi = E_V: the epochs of each policy-phase iteration"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return"""
    clip_reward: float = 10.0
    """clip normalised rewards to [-clip_reward, clip_reward]"""
    n_iteration: int = 32
    """N_pi: PPO iterations in each policy phase"""
    e_auxiliary: int = 6
    """E_aux: epochs of each auxiliary phase"""
    beta_clone: float = 1.0
    """weight of the behaviour-cloning KL in the auxiliary phase"""
    aux_minibatch_size: int = 1024
    """states per auxiliary-phase minibatch"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size of a policy-phase iteration (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    aux_batch_size: int = 0
    """the states in the buffer of one auxiliary phase (computed in runtime)"""
    num_phases: int = 0
    """the number of PPG phases (computed in runtime)"""


def fail(message: str) -> None:
    """Bad input: one line on stderr and exit status 2, before anything is written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def validate(args: Args) -> None:
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes")
    for name in (*positive, "n_iteration", "e_auxiliary", "aux_minibatch_size"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not 0.0 < args.gamma <= 1.0 or not 0.0 <= args.gae_lambda <= 1.0:
        fail("--gamma must be in (0, 1] and --gae-lambda in [0, 1]")
    if args.beta_clone < 0:
        fail(f"--beta-clone must be >= 0, got {args.beta_clone}")
    if args.batch_size % args.num_minibatches != 0:
        fail(
            f"num_envs * num_steps = {args.batch_size} is not divisible by --num-minibatches {args.num_minibatches}; "
            "change --num-envs, --num-steps or --num-minibatches"
        )
    if args.aux_batch_size % args.aux_minibatch_size != 0:
        fail(
            f"n_iteration * num_envs * num_steps = {args.aux_batch_size} is not divisible by --aux-minibatch-size "
            f"{args.aux_minibatch_size}"
        )
    if args.num_phases < 1:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one PPG phase "
            f"(n_iteration * num_envs * num_steps = {args.aux_batch_size})"
        )
    if args.upload_model and not args.save_model:
        fail("--upload-model uploads the saved model: add --save-model")
    if args.checkpoint_frequency < 0 or args.keep_checkpoints < 1:
        fail("--checkpoint-frequency must be >= 0 and --keep-checkpoints >= 1")
    if args.num_levels < 0 or args.start_level < 0:
        fail("--num-levels and --start-level must be >= 0")
    if args.distribution_mode not in DISTRIBUTION_MODES:
        fail(f"unknown --distribution-mode {args.distribution_mode!r}; one of {', '.join(DISTRIBUTION_MODES)}")
    if game_name(args.env_id) is None:
        fail(f"unknown procgen environment id {args.env_id!r}; one of {', '.join(ENV_NAMES)}")
    reason = procgen_unavailable_reason()
    if reason:
        fail(reason)


def make_env(args, num_envs, seed, evaluation=False, video_folder=None):
    # Evaluation draws levels from the full distribution: unseen ones when training on --num-levels N.
    levels = (0, 0) if evaluation else (args.num_levels, args.start_level)
    return make_procgen_env(args.env_id, num_envs, *levels, args.distribution_mode, seed, video_folder)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class ResidualBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x):
        # Pre-activation (ReLU before each conv) keeps the skip path an identity, as in IMPALA.
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ConvSequence(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)  # halves the resolution
        self.res0 = ResidualBlock(out_channels)
        self.res1 = ResidualBlock(out_channels)

    def forward(self, x):
        return self.res1(self.res0(self.pool(self.conv(x))))


def impala_cnn(channels=(16, 32, 32), hidden=256):
    """64x64x3 -> 256 features. The convolutions keep PyTorch's default (Kaiming-uniform) init:
    an orthogonal gain of sqrt(2) on both convs of every residual block makes activations grow with depth."""
    stages, in_channels = [], 3
    for out_channels in channels:
        stages.append(ConvSequence(in_channels, out_channels))
        in_channels = out_channels
    side = 64 // 2 ** len(channels)
    return nn.Sequential(
        *stages,
        nn.Flatten(),
        nn.ReLU(),
        layer_init(nn.Linear(in_channels * side * side, hidden)),
        nn.ReLU(),
    )


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        self.policy_network = impala_cnn()
        self.actor = layer_init(nn.Linear(256, envs.single_action_space.n), std=0.01)
        self.aux_critic = layer_init(nn.Linear(256, 1), std=1)  # trained in the auxiliary phase only
        self.value_network = impala_cnn()
        self.critic = layer_init(nn.Linear(256, 1), std=1)

    @staticmethod
    def images(x):
        # Observations arrive as (N, 64, 64, 3) uint8; convolutions want (N, 3, 64, 64) floats.
        return x.permute(0, 3, 1, 2) / 255.0

    def get_value(self, x):
        return self.critic(self.value_network(self.images(x)))

    def get_logits_and_aux_value(self, x):
        hidden = self.policy_network(self.images(x))
        return self.actor(hidden), self.aux_critic(hidden)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(self.policy_network(self.images(x)))
        # No argument validation: NaNs are reported by the gradient-norm check with a clear message.
        probs = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.get_value(x)


class RunningMeanStd:
    """Running mean and variance over batches (the parallel update of Chan et al. 1979)."""

    def __init__(self, shape=(), epsilon=1e-4):
        self.mean, self.var, self.count = np.zeros(shape, np.float64), np.ones(shape, np.float64), epsilon

    def update(self, x):
        batch_mean, batch_var, batch_count = np.mean(x, axis=0), np.var(x, axis=0), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean, self.var, self.count = self.mean + delta * batch_count / total, m2 / total, total

    def state_dict(self):
        # Tensors, so that `torch.load(..., weights_only=True)` reads the saved model.
        return {"mean": torch.tensor(self.mean), "var": torch.tensor(self.var), "count": float(self.count)}

    def load_state_dict(self, state):
        self.mean, self.var, self.count = state["mean"].numpy().copy(), state["var"].numpy().copy(), state["count"]


def compute_gae(rewards, values, terminations, next_value, gamma, gae_lambda):
    """GAE for a rollout of shape (num_steps, num_envs); ``terminations[t]``: row t ended its episode."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last_gae_lam = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        next_values = next_value if t == num_steps - 1 else values[t + 1]
        not_done = 1.0 - terminations[t]
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        last_gae_lam = delta + gamma * gae_lambda * not_done * last_gae_lam
        advantages[t] = last_gae_lam
    return advantages, advantages + values


if __name__ == "__main__":
    args = tyro.cli(Args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.aux_batch_size = args.n_iteration * args.batch_size
    args.num_phases = args.total_timesteps // args.aux_batch_size
    validate(args)
    script = os.path.basename(__file__)[: -len(".py")]
    try:
        resume_state = find_resume_state(args.resume, args.run_name and f"runs/{args.run_name}", script)
    except CheckpointError as e:
        fail(str(e))
    for key in ("env_id", "num_envs", "num_steps", "n_iteration"):
        if resume_state is not None and resume_state["args"][key] != getattr(args, key):
            fail(f"the checkpoint has --{key.replace('_', '-')} {resume_state['args'][key]}; resume with the same")
    run_name = (
        resume_state["run_name"]
        if resume_state
        else args.run_name or f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    )
    run_dir = f"runs/{run_name}"

    if args.track:
        import wandb

        # Patching TensorBoard (rather than `sync_tensorboard=True`) sends the same scalars and
        # avoids a 10 s stall in `wandb.finish()`.
        wandb.tensorboard.patch(root_logdir=f"runs/{run_name}")
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            config=vars(args),
            name=run_name,
            id=hashlib.sha1(run_name.encode()).hexdigest()[:16],  # the same W&B run after a resume
            resume="allow",
            save_code=True,
        )
    # A resumed run appends to the same folder; purge_step hides what the interrupted attempt logged
    # after its last checkpoint, so no step appears twice.
    writer = SummaryWriter(run_dir, purge_step=resume_state["global_step"] + 1 if resume_state else None)
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()),
    )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    global_step, start_phase = (resume_state["global_step"], resume_state["phase"] + 1) if resume_state else (0, 1)
    # Game states are not checkpointed: a resumed run starts new episodes, seeded apart from the first ones.
    video_folder = f"videos/{run_name}" if args.capture_video else None
    envs = make_env(args, args.num_envs, args.seed + global_step, video_folder=video_folder)

    agent = Agent(envs).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    return_rms = RunningMeanStd(shape=())
    discounted_returns = np.zeros(args.num_envs, np.float64)

    def normalize_reward(reward, ended):
        if not args.norm_reward:
            return reward
        # Scale by the std of the discounted return (not of the reward), restarting it at episode ends.
        discounted_returns[:] = discounted_returns * args.gamma + reward
        return_rms.update(discounted_returns)
        discounted_returns[ended] = 0.0
        return np.clip(reward / np.sqrt(return_rms.var + 1e-8), -args.clip_reward, args.clip_reward)

    # ALGO Logic: Storage setup. Frames are uint8 (4x less memory than float32), scaled in the network.
    obs_shape, num_steps, num_envs = envs.single_observation_space.shape, args.num_steps, args.num_envs
    obs = torch.zeros((num_steps, num_envs) + obs_shape, dtype=torch.uint8, device=device)
    actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
    logprobs, rewards, terminations, values = (torch.zeros((num_steps, num_envs), device=device) for _ in range(4))
    # The auxiliary phase's buffer: every frame and value target of the policy phase.
    aux_obs = torch.zeros((args.n_iteration, num_steps, num_envs) + obs_shape, dtype=torch.uint8, device=device)
    aux_returns = torch.zeros((args.n_iteration, num_steps, num_envs), device=device)

    if resume_state is not None:
        agent.load_state_dict(resume_state["model"])
        optimizer.load_state_dict(resume_state["optimizer"])
        set_rng_state(resume_state["rng"][0])
        return_rms.load_state_dict(resume_state["return_rms"])
        discounted_returns[:] = resume_state["discounted_returns"].numpy()
        print(f"resumed from {resume_state['path']} at global_step={global_step}", flush=True)

    def phase_boundary_state(phase):
        # A copy, so that a stop signal later in the next phase can still write this state.
        return copy.deepcopy(
            {
                "script": script,
                "run_name": run_name,
                "args": vars(args),
                "global_step": global_step,
                "phase": phase,
                "iteration": phase * args.n_iteration,
                "model": agent.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": [rng_state()],
                "return_rms": return_rms.state_dict(),
                "discounted_returns": torch.tensor(discounted_returns),
            }
        )

    boundary = phase_boundary_state(start_phase - 1)
    stop = StopRequest().install()  # its checkpoint is the state at the last phase boundary

    # TRY NOT TO MODIFY: start the game
    start_time = time.time()
    start_step = global_step
    progress = Progress(args.total_timesteps, start_step=global_step)
    next_obs, _ = envs.reset(seed=args.seed + global_step)
    next_obs = torch.as_tensor(next_obs, device=device)

    for phase in range(start_phase, args.num_phases + 1):
        # POLICY PHASE: n_iteration PPO iterations; the value network trains alongside (E_V = E_pi).
        for policy_iteration in range(args.n_iteration):
            iteration = (phase - 1) * args.n_iteration + policy_iteration + 1
            for step in range(0, num_steps):
                global_step += num_envs
                obs[step] = next_obs
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step], actions[step], logprobs[step] = value.flatten(), action, logprob

                next_obs_np, reward, terminated, _, infos = envs.step(action.cpu().numpy())
                reward = normalize_reward(reward, terminated)
                rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
                terminations[step] = torch.as_tensor(terminated, dtype=torch.float32, device=device)
                next_obs = torch.as_tensor(next_obs_np, device=device)
                if "episode" in infos:
                    for i in np.nonzero(infos["_episode"])[0]:
                        writer.add_scalar("charts/episodic_return", infos["episode"]["r"][i], global_step)
                        progress.episode(infos["episode"]["r"][i])
                        writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], global_step)
                if stop.requested:
                    break
            if stop.requested:
                break

            with torch.no_grad():
                next_value = agent.get_value(next_obs).reshape(1, -1)[0]
                advantages, returns = compute_gae(
                    rewards, values, terminations, next_value, args.gamma, args.gae_lambda
                )
            aux_obs[policy_iteration], aux_returns[policy_iteration] = obs, returns

            b_obs = obs.reshape((-1,) + obs_shape)
            b_logprobs, b_actions, b_advantages = logprobs.reshape(-1), actions.reshape(-1), advantages.reshape(-1)
            b_returns, b_values = returns.reshape(-1), values.reshape(-1)
            b_inds = np.arange(args.batch_size)
            clipfracs = []
            for _epoch in range(args.update_epochs):
                np.random.shuffle(b_inds)
                for start in range(0, args.batch_size, args.minibatch_size):
                    mb_inds = b_inds[start : start + args.minibatch_size]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()
                    with torch.no_grad():
                        # calculate approx_kl http://joschu.net/blog/kl-approx.html
                        old_approx_kl = (-logratio).mean()
                        approx_kl = ((ratio - 1) - logratio).mean()
                        clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]
                    mb_advantages = b_advantages[mb_inds]
                    if args.norm_adv:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                    # The value network is separate, so its loss needs no clipping against the policy's.
                    v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb_inds]) ** 2).mean()
                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                    optimizer.zero_grad()
                    loss.backward()
                    grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    if not torch.isfinite(grad_norm):
                        exit_non_finite(global_step, iteration, run_dir, script)
                    optimizer.step()

            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
            var_y = np.var(y_true)
            explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            writer.add_scalar("losses/clipfrac", np.mean(clipfracs), global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            progress.update(global_step)
        if stop.requested:
            break

        # AUXILIARY PHASE. The policy before the phase is the behaviour-cloning target.
        flat_obs, flat_returns = aux_obs.view((-1,) + obs_shape), aux_returns.view(-1)
        with torch.no_grad():
            old_logits = torch.cat(
                [agent.get_logits_and_aux_value(x)[0] for x in flat_obs.split(args.aux_minibatch_size)]
            )
        aux_inds = np.arange(args.aux_batch_size)
        for _epoch in range(args.e_auxiliary):
            np.random.shuffle(aux_inds)
            for start in range(0, args.aux_batch_size, args.aux_minibatch_size):
                mb_inds = torch.as_tensor(aux_inds[start : start + args.aux_minibatch_size], device=device)
                mb_obs, mb_returns = flat_obs[mb_inds], flat_returns[mb_inds]
                new_logits, aux_value = agent.get_logits_and_aux_value(mb_obs)
                # KL(pi_old || pi_new), exact over the 15 actions.
                old_log_probs = F.log_softmax(old_logits[mb_inds], dim=-1)
                kl_loss = (old_log_probs.exp() * (old_log_probs - F.log_softmax(new_logits, dim=-1))).sum(-1).mean()
                aux_value_loss = 0.5 * ((aux_value.view(-1) - mb_returns) ** 2).mean()
                real_value_loss = 0.5 * ((agent.get_value(mb_obs).view(-1) - mb_returns) ** 2).mean()
                loss = aux_value_loss + args.beta_clone * kl_loss + real_value_loss

                optimizer.zero_grad()
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                if not torch.isfinite(grad_norm):
                    exit_non_finite(global_step, iteration, run_dir, script)
                optimizer.step()
            if stop.requested:
                break
        if stop.requested:
            break
        writer.add_scalar("losses/aux/kl_loss", kl_loss.item(), global_step)
        writer.add_scalar("losses/aux/aux_value_loss", aux_value_loss.item(), global_step)
        writer.add_scalar("losses/aux/real_value_loss", real_value_loss.item(), global_step)
        print(f"phase {phase}/{args.num_phases} done at global_step={global_step}", flush=True)

        if not all(torch.isfinite(p).all() for p in agent.parameters()):
            exit_non_finite(global_step, iteration, run_dir, script)
        boundary = phase_boundary_state(phase)
        if args.checkpoint_frequency > 0 and phase % args.checkpoint_frequency == 0:
            save_checkpoint(boundary, run_dir, keep=args.keep_checkpoints)

    if stop.requested:
        path = save_checkpoint(boundary, run_dir, keep=args.keep_checkpoints)
        print(f"{stop.signal_name}: checkpoint {path} written at global_step={boundary['global_step']}", flush=True)
        envs.close()
        writer.close()
        if args.track:
            wandb.finish(exit_code=EXIT_PREEMPTED)
        raise SystemExit(EXIT_PREEMPTED)
    if args.checkpoint_frequency > 0 and boundary["phase"] % args.checkpoint_frequency != 0:
        save_checkpoint(boundary, run_dir, keep=args.keep_checkpoints)  # a retry of a finished run does nothing

    progress.close()
    if args.save_model:
        model_path = f"{run_dir}/{args.exp_name}.cleanrl_model"
        atomic_torch_save(
            {
                "script": script,
                "env_id": args.env_id,
                "args": vars(args),
                "model_state_dict": agent.state_dict(),
                "return_rms": return_rms.state_dict(),
            },
            model_path,
        )
        print(f"model saved to {model_path}")
        episodic_returns = evaluate(
            model_path, make_env, args.env_id, args.eval_episodes, f"{run_name}-eval", Agent, device,
            capture_video=args.capture_video, seed=args.seed + 100_000,
        )  # fmt: skip
        for idx, episodic_return in enumerate(episodic_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(f"evaluation over {len(episodic_returns)} episodes: mean return {np.mean(episodic_returns):.1f}")

    envs.close()
    writer.close()
    if args.track:
        wandb.finish()
    if args.upload_model:
        from cleanrl_utils.huggingface import push_run

        push_run(args, run_name, model_path, episodic_returns, __file__)
