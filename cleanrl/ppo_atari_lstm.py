"""PPO with an LSTM core on Atari (BreakoutNoFrameskip-v4 by default), one frame per step.

The agent sees a single 84x84 grayscale frame (no frame stack) and must carry what it needs (the
ball's direction, say) in the hidden state of an LSTM between the Nature CNN and the actor/critic
heads. Everything else is ``ppo_atari.py``: the same Atari preprocessing, GAE, clipped losses,
``AsyncVectorEnv`` with ``AutoresetMode.SAME_STEP`` and bootstrapping of truncated episodes.

Two things make the recurrence correct:

* the LSTM state is zeroed exactly where an episode starts (after a game over, and after a lost
  life, since ``EpisodicLifeEnv`` ends the agent's episode there), both while acting and while
  training; ``dones[t]`` marks that ``obs[t]`` is the first frame of an episode;
* minibatches are whole env sequences (``--num-envs`` is split into ``--num-minibatches`` groups of
  envs, each keeping all ``--num-steps`` steps in order), replayed from the LSTM state the rollout
  started with, so the training pass recomputes the states the rollout used.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import time
from dataclasses import dataclass

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from gymnasium.vector import AutoresetMode
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils.atari_wrappers import (
    ClipRewardEnv,
    EpisodicLifeEnv,
    FireResetEnv,
    MaxAndSkipEnv,
    NoopResetEnv,
    has_fire_action,
)
from cleanrl_utils.checkpoint import (
    EXIT_PREEMPTED,
    CheckpointError,
    StopRequest,
    env_worker_ignores_stop_signals,
    exit_non_finite,
    find_resume_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from cleanrl_utils.evals import evaluate
from cleanrl_utils.io import atomic_torch_save
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
    checkpoint_frequency: int = 100
    """write a checkpoint every N iterations to runs/<run_name>/checkpoints (0: only on SIGTERM/SIGINT)"""
    keep_checkpoints: int = 3
    """how many of the newest checkpoints to keep"""
    resume: str | None = None
    """resume from a checkpoint file, or `auto`: the newest checkpoint of --run-name (fresh start if none)"""
    eval_episodes: int = 10
    """episodes (whole games) of evaluation after --save-model, one per env"""

    # Algorithm specific arguments
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the Atari environment (`<Game>NoFrameskip-v4`, or `ALE/<Game>-v5` with its sticky actions)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment (summed over all envs)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments (each in its own subprocess)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout (the training sequence length)"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (each holds num_envs / num_minibatches whole env sequences)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (stops the update epochs early when exceeded)"""
    lstm_hidden_size: int = 128
    """the size of the LSTM's hidden and cell states"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def fail(message: str) -> None:
    """Bad input: one line on stderr and exit status 2, before anything is written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def validate(args: Args) -> None:
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes")
    for name in (*positive, "lstm_hidden_size"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not 0.0 < args.gamma <= 1.0 or not 0.0 <= args.gae_lambda <= 1.0:
        fail("--gamma must be in (0, 1] and --gae-lambda in [0, 1]")
    if args.num_envs % args.num_minibatches != 0:
        fail(
            f"--num-envs {args.num_envs} is not divisible by --num-minibatches {args.num_minibatches}; "
            "a minibatch holds whole env sequences, so change --num-envs or --num-minibatches"
        )
    if args.num_iterations < 1:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one rollout (num_envs * num_steps = {args.batch_size})"
        )
    if args.upload_model and not args.save_model:
        fail("--upload-model uploads the saved model: add --save-model")
    if args.checkpoint_frequency < 0 or args.keep_checkpoints < 1:
        fail("--checkpoint-frequency must be >= 0 and --keep-checkpoints >= 1")
    gym.register_envs(ale_py)
    try:
        spec = gym.spec(args.env_id)
    except gym.error.Error as e:
        fail(f"unknown environment id {args.env_id!r} ({type(e).__name__}: {e})")
    if not str(spec.entry_point).startswith("ale_py"):
        fail(
            f"{args.env_id} is not an Atari (ALE) environment; ppo_atari_lstm.py needs one, e.g. BreakoutNoFrameskip-v4"
        )


def make_env(env_id, idx, capture_video, run_name):
    def thunk():
        env_worker_ignores_stop_signals()  # the training process handles SIGTERM/SIGINT and closes us
        # Registered here, inside the worker, so that any multiprocessing start method works.
        gym.register_envs(ale_py)
        # MaxAndSkipEnv does the frame skipping, so the emulator itself must not skip.
        if capture_video and idx == 0:
            env = gym.make(env_id, frameskip=1, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        else:
            env = gym.make(env_id, frameskip=1)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = NoopResetEnv(env, noop_max=30)
        env = MaxAndSkipEnv(env, skip=4)
        env = EpisodicLifeEnv(env)
        if has_fire_action(env):
            env = FireResetEnv(env)
        env = ClipRewardEnv(env)
        env = gym.wrappers.ResizeObservation(env, (84, 84))
        # One frame, no stack: the LSTM is the agent's memory.
        env = gym.wrappers.GrayscaleObservation(env)
        return env

    return thunk


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs, lstm_hidden_size=128):
        super().__init__()
        # The Nature DQN torso (Mnih et al. 2015) on one frame.
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(1, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.lstm = nn.LSTM(512, lstm_hidden_size)
        for name, param in self.lstm.named_parameters():
            # Orthogonal recurrent weights keep the state's scale steady over 128-step sequences.
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(lstm_hidden_size, envs.single_action_space.n), std=0.01)
        self.critic = layer_init(nn.Linear(lstm_hidden_size, 1), std=1)

    def initial_state(self, num_envs, device=None):
        shape = (self.lstm.num_layers, num_envs, self.lstm.hidden_size)
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)

    def get_states(self, x, lstm_state, done):
        """Run the LSTM over ``x``: T*B frames in time-major order (row t*B + b is env b at step t).

        ``lstm_state`` is the state before step 0 for each of the B envs; ``done[t*B + b] = 1`` says that
        frame starts an episode, so the state is zeroed before that frame is read. While acting T = 1.
        """
        # Frames come as (N, 84, 84) uint8; the CNN wants one channel.
        hidden = self.network(x.unsqueeze(1) / 255.0)
        batch_size = lstm_state[0].shape[1]
        hidden = hidden.reshape((-1, batch_size, self.lstm.input_size))
        done = done.reshape((-1, batch_size))
        outputs = []
        for h, d in zip(hidden, done, strict=True):
            keep = (1.0 - d).view(1, -1, 1)
            h_out, lstm_state = self.lstm(h.unsqueeze(0), (keep * lstm_state[0], keep * lstm_state[1]))
            outputs.append(h_out)
        return torch.flatten(torch.cat(outputs), 0, 1), lstm_state

    def get_value(self, x, lstm_state, done):
        hidden, _ = self.get_states(x, lstm_state, done)
        return self.critic(hidden)

    def get_action_and_value(self, x, lstm_state, done, action=None):
        hidden, lstm_state = self.get_states(x, lstm_state, done)
        logits = self.actor(hidden)
        # No argument validation: NaNs are reported by the gradient-norm check with a clear message.
        probs = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden), lstm_state


def env_minibatches(num_steps, num_envs, num_minibatches):
    """Shuffled minibatches of whole env sequences: (env indices, their rows of the flat batch, time-major)."""
    flat_inds = np.arange(num_steps * num_envs).reshape(num_steps, num_envs)
    for mb_envs in np.split(np.random.permutation(num_envs), num_minibatches):
        yield mb_envs, flat_inds[:, mb_envs].ravel()


def compute_gae(rewards, values, terminations, truncations, final_values, next_value, gamma, gae_lambda):
    """GAE for a rollout of shape (num_steps, num_envs), as in ``ppo_atari.py``: after a termination the
    bootstrap value is 0, after a truncation V(final observation), otherwise V(s_{t+1}); the lambda-chain
    is cut at every episode end."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last_gae_lam = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        next_values = next_value if t == num_steps - 1 else values[t + 1]
        ended = torch.maximum(terminations[t], truncations[t])
        bootstrap = torch.where(ended > 0, final_values[t] * (1.0 - terminations[t]), next_values)
        delta = rewards[t] + gamma * bootstrap - values[t]
        last_gae_lam = delta + gamma * gae_lambda * (1.0 - ended) * last_gae_lam
        advantages[t] = last_gae_lam
    return advantages, advantages + values


if __name__ == "__main__":
    args = tyro.cli(Args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    validate(args)
    script = os.path.basename(__file__)[: -len(".py")]
    try:
        resume_state = find_resume_state(args.resume, args.run_name and f"runs/{args.run_name}", script)
    except CheckpointError as e:
        fail(str(e))
    for key in ("env_id", "num_envs", "num_steps", "lstm_hidden_size"):
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

    # env setup
    envs = gym.vector.AsyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(args.num_envs)],
        shared_memory=True,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    envs.action_space.seed(args.seed)

    agent = Agent(envs, args.lstm_hidden_size).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ALGO Logic: Storage setup. Frames are uint8 (4x less memory than float32), scaled in the network.
    num_steps, num_envs = args.num_steps, args.num_envs
    obs = torch.zeros((num_steps, num_envs) + envs.single_observation_space.shape, dtype=torch.uint8, device=device)
    actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
    logprobs, rewards, dones, values = (torch.zeros((num_steps, num_envs), device=device) for _ in range(4))
    terminations, truncations, final_values = (torch.zeros((num_steps, num_envs), device=device) for _ in range(3))

    global_step, start_iteration = 0, 1
    if resume_state is not None:
        agent.load_state_dict(resume_state["model"])
        optimizer.load_state_dict(resume_state["optimizer"])
        set_rng_state(resume_state["rng"][0])
        global_step, start_iteration = resume_state["global_step"], resume_state["iteration"] + 1
        print(f"resumed from {resume_state['path']} at global_step={global_step}", flush=True)
    completed_iteration, completed_step = start_iteration - 1, global_step

    def write_checkpoint():
        return save_checkpoint(
            {
                "script": script,
                "run_name": run_name,
                "args": vars(args),
                "global_step": completed_step,
                "iteration": completed_iteration,
                "model": agent.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": [rng_state()],
            },
            run_dir,
            keep=args.keep_checkpoints,
        )

    stop = StopRequest().install()

    # TRY NOT TO MODIFY: start the game
    start_time = time.time()
    start_step = global_step
    progress = Progress(args.total_timesteps, start_step=global_step)
    # Emulator and LSTM states are not checkpointed: a resumed run starts new episodes from a zero state.
    next_obs, _ = envs.reset(seed=args.seed + global_step)
    next_obs = torch.as_tensor(next_obs, device=device)
    next_done = torch.ones(num_envs, device=device)  # every env starts an episode
    next_lstm_state = agent.initial_state(num_envs, device)

    for iteration in range(start_iteration, args.num_iterations + 1):
        # The training pass replays each env's sequence from the state this rollout starts with.
        initial_lstm_state = (next_lstm_state[0].clone(), next_lstm_state[1].clone())
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        for step in range(0, num_steps):
            global_step += num_envs
            obs[step], dones[step] = next_obs, next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value, next_lstm_state = agent.get_action_and_value(
                    next_obs, next_lstm_state, next_done
                )
            values[step], actions[step], logprobs[step] = value.flatten(), action, logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
            terminations[step] = torch.as_tensor(terminated, dtype=torch.float32, device=device)
            truncations[step] = torch.as_tensor(truncated, dtype=torch.float32, device=device)
            final_values[step] = 0.0
            # A truncated episode is bootstrapped from its last frame, read with the state it ended in.
            bootstrap_idx = np.nonzero(truncated & ~terminated)[0]
            if len(bootstrap_idx) > 0:
                final_obs = torch.as_tensor(np.stack(infos["final_obs"][bootstrap_idx]), device=device)
                carried = (next_lstm_state[0][:, bootstrap_idx], next_lstm_state[1][:, bootstrap_idx])
                with torch.no_grad():
                    final_values[step, bootstrap_idx] = agent.get_value(
                        final_obs, carried, torch.zeros(len(bootstrap_idx), device=device)
                    ).flatten()
            next_obs = torch.as_tensor(next_obs_np, device=device)
            next_done = torch.as_tensor(terminated | truncated, dtype=torch.float32, device=device)

            if "final_info" in infos and "episode" in infos["final_info"]:
                episode = infos["final_info"]["episode"]
                for i in np.nonzero(infos["final_info"]["_episode"])[0]:
                    writer.add_scalar("charts/episodic_return", episode["r"][i], global_step)
                    progress.episode(episode["r"][i])
                    writer.add_scalar("charts/episodic_length", episode["l"][i], global_step)
            if stop.requested:
                break  # the partial rollout is dropped; the checkpoint is the last whole iteration
        if stop.requested:
            break

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs, next_lstm_state, next_done).reshape(1, -1)[0]
            advantages, returns = compute_gae(
                rewards, values, terminations, truncations, final_values, next_value, args.gamma, args.gae_lambda
            )

        # flatten the batch, time-major (row t * num_envs + e), the order get_states expects
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs, b_actions, b_dones = logprobs.reshape(-1), actions.reshape(-1), dones.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)

        # Optimizing the policy and value network
        clipfracs = []
        for _epoch in range(args.update_epochs):
            for mb_envs, mb_inds in env_minibatches(num_steps, num_envs, args.num_minibatches):
                _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
                    b_obs[mb_inds],
                    (initial_lstm_state[0][:, mb_envs], initial_lstm_state[1][:, mb_envs]),
                    b_dones[mb_inds],
                    b_actions[mb_inds],
                )
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

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                if not torch.isfinite(grad_norm):
                    exit_non_finite(global_step, iteration, run_dir, script)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
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

        if not all(torch.isfinite(p).all() for p in agent.parameters()):
            exit_non_finite(global_step, iteration, run_dir, script)
        completed_iteration, completed_step = iteration, global_step
        if args.checkpoint_frequency > 0 and iteration % args.checkpoint_frequency == 0 and not stop.requested:
            write_checkpoint()
        if stop.requested:
            break

    if stop.requested:
        path = write_checkpoint()
        print(f"{stop.signal_name}: checkpoint {path} written at global_step={completed_step}; exiting", flush=True)
        envs.close()
        writer.close()
        if args.track:
            wandb.finish(exit_code=EXIT_PREEMPTED)
        raise SystemExit(EXIT_PREEMPTED)
    if args.checkpoint_frequency > 0 and completed_iteration % args.checkpoint_frequency != 0:
        write_checkpoint()  # the final state, so that a retry of a finished run has nothing left to do

    progress.close()
    if args.save_model:
        model_path = f"{run_dir}/{args.exp_name}.cleanrl_model"
        atomic_torch_save(
            {"script": script, "env_id": args.env_id, "args": vars(args), "model_state_dict": agent.state_dict()},
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
