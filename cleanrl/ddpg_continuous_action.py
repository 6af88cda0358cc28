"""DDPG for continuous actions (MuJoCo v5 tasks and classic control, Hopper-v5 by default).

Deep Deterministic Policy Gradient (Lillicrap et al. 2016): a deterministic actor trained to
maximise one Q-network, the Q-network trained on the one-step TD target of slowly moving (Polyak,
``--tau``) target copies of both, and Gaussian exploration noise on the actor's actions (the
paper's Ornstein-Uhlenbeck noise is no better on these tasks and harder to reason about). As in
the TD3 paper's re-tuned DDPG, the actor and the targets move every ``--policy-frequency``
critic updates.

Vectorized: ``--num-envs`` envs step in-process (``SyncVectorEnv``, gymnasium's default next-step
autoreset). ``global_step`` counts the steps of all envs, and the script makes one gradient step
per global step after ``--learning-starts``, so ``--num-envs`` changes the wall clock, not the
number of updates per transition. The reset step that follows an episode end is never stored; a
truncated episode keeps its final observation as ``next_obs`` and is bootstrapped, a terminated
one is not. The actor's tanh output is mapped onto the env's action bounds (asymmetric ones too),
and every action is clipped to the bounds after the exploration noise.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tyro
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils.buffers import ReplayBuffer
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
from cleanrl_utils.progress import Progress


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
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
    checkpoint_frequency: int = 100000
    """write a checkpoint every N global steps to runs/<run_name>/checkpoints (0: only on SIGTERM/SIGINT)"""
    keep_checkpoints: int = 3
    """how many of the newest checkpoints to keep"""
    resume: str | None = None
    """resume from a checkpoint file, or `auto`: the newest checkpoint of --run-name (fresh start if none)"""
    checkpoint_buffer: bool = False
    """also store the replay buffer in checkpoints (as large as the buffer itself)"""
    eval_episodes: int = 10
    """episodes of evaluation after --save-model (the deterministic actor, no exploration noise)"""

    # Algorithm specific arguments
    env_id: str = "Hopper-v5"
    """the id of the environment (continuous Box actions, vector observations)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment (summed over all envs)"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizers"""
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = 1000000
    """the replay memory buffer size (transitions)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    hidden_size: int = 256
    """the width of the two hidden layers of the actor and the critics"""
    exploration_noise: float = 0.1
    """the scale of the exploration noise (a fraction of the half-range of the actions)"""
    learning_starts: int = 25000
    """global step to start learning (uniformly random actions before it)"""
    policy_frequency: int = 2
    """the frequency of training the actor and updating the targets (delayed, in critic updates)"""

    # to be filled in runtime
    num_iterations: int = 0
    """the number of vector steps (computed in runtime)"""


def fail(message: str) -> None:
    """Bad input: one line on stderr and exit status 2, before anything is written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def validate(args: Args) -> None:
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "hidden_size", "policy_frequency")
    for name in (*positive, "eval_episodes", "learning_rate"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.learning_starts < 0 or args.checkpoint_frequency < 0 or args.keep_checkpoints < 1:
        fail("--learning-starts and --checkpoint-frequency must be >= 0, --keep-checkpoints >= 1")
    if not 0.0 < args.tau <= 1.0 or not 0.0 < args.gamma <= 1.0:
        fail("--tau and --gamma must be in (0, 1]")
    if args.exploration_noise < 0:
        fail("--exploration-noise must be >= 0")
    if args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is less than one step of the {args.num_envs} envs")
    if args.upload_model and not args.save_model:
        fail("--upload-model uploads the saved model: add --save-model")
    try:
        env = gym.make(args.env_id)
    except (gym.error.Error, ImportError) as e:
        fail(f"unknown or unusable environment id {args.env_id!r} ({type(e).__name__}: {e})")
    try:
        space = env.action_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            fail(f"{args.env_id} has action space {space}; ddpg_continuous_action.py handles only 1-D Box actions")
        if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
            fail(f"{args.env_id} has unbounded actions {space}; the actor needs finite bounds to scale to")
        if not isinstance(env.observation_space, gym.spaces.Box) or len(env.observation_space.shape) != 1:
            fail(f"{args.env_id} has observation space {env.observation_space}; this script needs flat vectors")
    finally:
        env.close()


def make_env(env_id, idx, capture_video, run_name):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        else:
            env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        return env

    return thunk


class QNetwork(nn.Module):
    def __init__(self, envs, hidden_size=256):
        super().__init__()
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        act_dim = int(np.prod(envs.single_action_space.shape))
        self.fc1 = nn.Linear(obs_dim + act_dim, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        self.fc3 = nn.Linear(hidden_size, 1)

    def forward(self, x, a):
        x = torch.cat([x, a], 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Actor(nn.Module):
    def __init__(self, envs, hidden_size=256):
        super().__init__()
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        act_dim = int(np.prod(envs.single_action_space.shape))
        self.fc1 = nn.Linear(obs_dim, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        self.fc_mu = nn.Linear(hidden_size, act_dim)
        # tanh lands in [-1, 1]; scale and bias map that onto [low, high], whatever the bounds' asymmetry.
        low = torch.tensor(envs.single_action_space.low, dtype=torch.float32)
        high = torch.tensor(envs.single_action_space.high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = torch.tanh(self.fc_mu(x))
        return x * self.action_scale + self.action_bias


if __name__ == "__main__":
    args = tyro.cli(Args)
    args.num_iterations = args.total_timesteps // args.num_envs
    if args.capture_video and sys.platform.startswith("linux"):
        # MuJoCo renders offscreen through EGL on a headless Linux box; it reads this on import.
        os.environ.setdefault("MUJOCO_GL", "egl")
    validate(args)
    script = os.path.basename(__file__)[: -len(".py")]
    try:
        resume_state = find_resume_state(args.resume, args.run_name and f"runs/{args.run_name}", script)
    except CheckpointError as e:
        fail(str(e))
    if resume_state is not None and resume_state["args"]["env_id"] != args.env_id:
        fail(f"the checkpoint is for {resume_state['args']['env_id']}, not {args.env_id}")
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
        wandb.tensorboard.patch(root_logdir=run_dir)
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
    rng = np.random.default_rng(args.seed)

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup (next-step autoreset: the buffer skips the reset step after each episode end)
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(args.num_envs)]
    )
    envs.action_space.seed(args.seed)
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high

    actor = Actor(envs, args.hidden_size).to(device)
    qf1 = QNetwork(envs, args.hidden_size).to(device)
    target_actor = Actor(envs, args.hidden_size).to(device)
    qf1_target = QNetwork(envs, args.hidden_size).to(device)
    target_actor.load_state_dict(actor.state_dict())
    qf1_target.load_state_dict(qf1.state_dict())
    q_optimizer = optim.Adam(qf1.parameters(), lr=args.learning_rate)
    actor_optimizer = optim.Adam(actor.parameters(), lr=args.learning_rate)
    networks = {"actor": actor, "qf1": qf1, "target_actor": target_actor, "qf1_target": qf1_target}
    optimizers = {"q_optimizer": q_optimizer, "actor_optimizer": actor_optimizer}

    rb = ReplayBuffer(
        args.buffer_size,
        args.num_envs,
        envs.single_observation_space.shape,
        action_shape=envs.single_action_space.shape,
        action_dtype=np.float32,
    )

    if args.checkpoint_buffer:
        print(f"warning: --checkpoint-buffer adds up to {rb.nbytes / 2**30:.2f} GiB to every checkpoint", flush=True)
    global_step, start_iteration, num_updates = 0, 1, 0
    if resume_state is not None:
        for name, module in (*networks.items(), *optimizers.items()):
            module.load_state_dict(resume_state[name])
        set_rng_state(resume_state["rng"][0])
        global_step, start_iteration = resume_state["global_step"], resume_state["iteration"] + 1
        num_updates = resume_state["num_updates"]
        if "replay_buffer" in resume_state:
            rb.load_state_dict(resume_state["replay_buffer"])
        # Without --checkpoint-buffer the buffer starts empty: learning waits until it holds a batch again.
        print(f"resumed from {resume_state['path']} at global_step={global_step}", flush=True)

    def write_checkpoint(iteration, step):
        return save_checkpoint(
            {
                "script": script,
                "run_name": run_name,
                "args": vars(args),
                "global_step": step,
                "iteration": iteration,
                "num_updates": num_updates,
                **{name: module.state_dict() for name, module in (*networks.items(), *optimizers.items())},
                "rng": [rng_state()],
                **({"replay_buffer": rb.state_dict()} if args.checkpoint_buffer else {}),
            },
            run_dir,
            keep=args.keep_checkpoints,
        )

    stop = StopRequest().install()
    start_time, start_step = time.time(), global_step
    progress = Progress(args.total_timesteps, start_step=global_step)
    actor_loss = None  # the actor trains only every --policy-frequency critic updates
    # Emulator states are not checkpointed: a resumed run starts new episodes, seeded apart from the first ones.
    obs, _ = envs.reset(seed=args.seed + global_step)
    iteration = start_iteration - 1
    for iteration in range(start_iteration, args.num_iterations + 1):
        previous_step, global_step = global_step, global_step + args.num_envs
        # ALGO LOGIC: put action logic here
        if global_step <= args.learning_starts:
            actions = envs.action_space.sample()
        else:
            with torch.no_grad():
                actions = actor(torch.Tensor(obs).to(device))
                actions += torch.randn_like(actions) * actor.action_scale * args.exploration_noise
                actions = actions.cpu().numpy()
        actions = np.clip(actions, action_low, action_high).astype(np.float32)

        # TRY NOT TO MODIFY: execute the game and log data.
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        if "episode" in infos:
            for i in np.nonzero(infos["_episode"])[0]:
                writer.add_scalar("charts/episodic_return", infos["episode"]["r"][i], global_step)
                progress.episode(infos["episode"]["r"][i])
                writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], global_step)

        progress.update(global_step)
        rb.add(obs, actions, rewards, terminations, truncations, next_obs)
        obs = next_obs

        # ALGO LOGIC: training, one gradient step per global step past --learning-starts.
        if global_step > args.learning_starts and rb.size >= args.batch_size:
            for _ in range(global_step - max(previous_step, args.learning_starts)):
                data = rb.sample(args.batch_size, rng, device)
                with torch.no_grad():
                    next_actions = target_actor(data.next_observations)
                    qf1_next_target = qf1_target(data.next_observations, next_actions).view(-1)
                    next_q_value = data.rewards + (1 - data.terminations) * args.gamma * qf1_next_target

                qf1_a_values = qf1(data.observations, data.actions).view(-1)
                qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
                if not torch.isfinite(qf1_loss):
                    exit_non_finite(global_step, iteration, run_dir, script)

                q_optimizer.zero_grad()
                qf1_loss.backward()
                q_optimizer.step()
                num_updates += 1

                if num_updates % args.policy_frequency == 0:
                    actor_loss = -qf1(data.observations, actor(data.observations)).mean()
                    actor_optimizer.zero_grad()
                    actor_loss.backward()
                    actor_optimizer.step()

                    # update the target networks
                    for net, target in ((actor, target_actor), (qf1, qf1_target)):
                        for param, target_param in zip(net.parameters(), target.parameters(), strict=True):
                            target_param.data.mul_(1.0 - args.tau).add_(args.tau * param.data)

                if num_updates % 100 == 0:
                    sps = int((global_step - start_step) / (time.time() - start_time))
                    writer.add_scalar("losses/qf1_values", qf1_a_values.mean().item(), global_step)
                    writer.add_scalar("losses/qf1_loss", qf1_loss.item(), global_step)
                    if actor_loss is not None:
                        writer.add_scalar("losses/actor_loss", actor_loss.item(), global_step)
                    writer.add_scalar("charts/SPS", sps, global_step)

        crossed = global_step // max(args.checkpoint_frequency, 1) != previous_step // max(args.checkpoint_frequency, 1)
        if args.checkpoint_frequency > 0 and crossed and not stop.requested:
            write_checkpoint(iteration, global_step)
        if stop.requested:
            path = write_checkpoint(iteration, global_step)
            print(f"{stop.signal_name}: checkpoint {path} written at global_step={global_step}; exiting", flush=True)
            envs.close()
            writer.close()
            if args.track:
                wandb.finish(exit_code=EXIT_PREEMPTED)
            raise SystemExit(EXIT_PREEMPTED)

    if not all(torch.isfinite(p).all() for net in networks.values() for p in net.parameters()):
        exit_non_finite(global_step, iteration, run_dir, script)
    if args.checkpoint_frequency > 0:
        write_checkpoint(iteration, global_step)  # the final state: a retry of a finished run has nothing to do

    progress.close()
    if args.save_model:
        model_path = f"{run_dir}/{args.exp_name}.cleanrl_model"
        atomic_torch_save(
            {
                "script": script,
                "env_id": args.env_id,
                "args": vars(args),
                "model_state_dict": actor.state_dict(),
                "critic_state_dicts": {"qf1": qf1.state_dict()},
            },
            model_path,
        )
        print(f"model saved to {model_path}")
        episodic_returns = evaluate(
            model_path,
            make_env,
            args.env_id,
            args.eval_episodes,
            f"{run_name}-eval",
            Actor,
            device,
            capture_video=args.capture_video,
            seed=args.seed + 100_000,
        )
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
