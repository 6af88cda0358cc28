"""C51 on Atari with the Nature CNN (BreakoutNoFrameskip-v4 by default).

Categorical DQN (Bellemare et al. 2017): for every action the network predicts a distribution over
``--n-atoms`` fixed returns evenly spaced in [``--v-min``, ``--v-max``]; the target distribution
``r + gamma * (1 - terminated) * z`` of the greedy next action (under the target network) is
projected back onto the atoms and the loss is the cross-entropy to it. Exploration, replay and the
target network work as in ``dqn_atari.py``.

Atari preprocessing as in ``ppo_atari.py`` (``cleanrl_utils.atari_wrappers``). The replay buffer
is ``cleanrl_utils.buffers.AtariFrameBuffer``: each 84x84 frame is stored once and the 4-frame
stacks are rebuilt when sampling, about 7 KB per transition instead of 56 KB, so the default
million transitions need under 7 GiB.

Vectorized: ``--num-envs`` envs step in subprocess workers (``AsyncVectorEnv`` with shared memory,
gymnasium's default next-step autoreset). ``global_step`` counts the steps of all envs, and the step-based flags
(``--learning-starts``, ``--train-frequency``, ``--target-network-frequency``) are in global
steps, so ``--num-envs`` changes the wall clock, not the number of updates per transition. The
reset step that follows an episode end is never stored; a truncated episode keeps its final
observation as ``next_obs`` and is bootstrapped, a terminated one is not.
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
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils.atari_wrappers import (
    ClipRewardEnv,
    EpisodicLifeEnv,
    FireResetEnv,
    MaxAndSkipEnv,
    NoopResetEnv,
    has_fire_action,
)
from cleanrl_utils.buffers import AtariFrameBuffer
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
    """episodes of evaluation after --save-model"""
    eval_epsilon: float = 0.05
    """epsilon of the evaluation episodes"""

    # Algorithm specific arguments
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the Atari environment (`<Game>NoFrameskip-v4`, or `ALE/<Game>-v5` with its sticky actions)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment (summed over all envs)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments (each in its own subprocess)"""
    buffer_size: int = 1000000
    """the replay memory buffer size (transitions; about 7 KB each)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: hard copy)"""
    n_atoms: int = 51
    """the number of atoms"""
    v_min: float = -10
    """the return corresponding to the lowest atom"""
    v_max: float = 10
    """the return corresponding to the highest atom"""
    target_network_frequency: int = 10000
    """the global steps between two updates of the target network"""
    batch_size: int = 32
    """the batch size of sample from the replay memory"""
    start_e: float = 1
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 80000
    """global step to start learning"""
    train_frequency: int = 4
    """the global steps between two gradient steps"""

    # to be filled in runtime
    num_iterations: int = 0
    """the number of vector steps (computed in runtime)"""


def fail(message: str) -> None:
    """Bad input: one line on stderr and exit status 2, before anything is written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def validate(args: Args) -> None:
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "train_frequency")
    for name in (*positive, "target_network_frequency", "eval_episodes"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.learning_starts < 0 or args.checkpoint_frequency < 0 or args.keep_checkpoints < 1:
        fail("--learning-starts and --checkpoint-frequency must be >= 0, --keep-checkpoints >= 1")
    if not 0.0 < args.tau <= 1.0 or not 0.0 < args.gamma <= 1.0:
        fail("--tau and --gamma must be in (0, 1]")
    if args.n_atoms < 2 or args.v_min >= args.v_max:
        fail("C51 needs --n-atoms >= 2 and --v-min < --v-max")
    if args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is less than one step of the {args.num_envs} envs")
    if args.upload_model and not args.save_model:
        fail("--upload-model uploads the saved model: add --save-model")
    if args.buffer_size < args.num_envs * 6:
        fail(f"--buffer-size {args.buffer_size} is too small for {args.num_envs} envs (at least 6 frames per env)")
    buffer_bytes = args.buffer_size * 7075
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if buffer_bytes > 0.9 * memory:
            fail(
                f"--buffer-size {args.buffer_size} needs {buffer_bytes / 2**30:.1f} GiB, this machine has "
                f"{memory / 2**30:.1f} GiB; lower --buffer-size"
            )
    gym.register_envs(ale_py)
    try:
        spec = gym.spec(args.env_id)
    except gym.error.Error as e:
        fail(f"unknown environment id {args.env_id!r} ({type(e).__name__}: {e})")
    if not str(spec.entry_point).startswith("ale_py"):
        fail(f"{args.env_id} is not an Atari (ALE) environment; c51_atari.py needs one, e.g. BreakoutNoFrameskip-v4")


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
        env = gym.wrappers.GrayscaleObservation(env)
        env = gym.wrappers.FrameStackObservation(env, 4)
        return env

    return thunk


class QNetwork(nn.Module):
    def __init__(self, envs, n_atoms=51, v_min=-10, v_max=10):
        super().__init__()
        self.register_buffer("atoms", torch.linspace(v_min, v_max, steps=n_atoms))
        self.n_atoms = n_atoms
        self.n = envs.single_action_space.n
        # The Nature DQN network (Mnih et al. 2015) with n_atoms outputs per action.
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, self.n * n_atoms),
        )

    def get_action(self, x, action=None):
        """The greedy action (or the given one) and its return distribution over the atoms."""
        pmfs = torch.softmax(self.network(x / 255.0).view(len(x), self.n, self.n_atoms), dim=2)
        q_values = (pmfs * self.atoms).sum(2)
        if action is None:
            action = torch.argmax(q_values, 1)
        return action, pmfs[torch.arange(len(x)), action]

    def forward(self, x):
        """Expected returns (Q-values) of every action."""
        pmfs = torch.softmax(self.network(x / 255.0).view(len(x), self.n, self.n_atoms), dim=2)
        return (pmfs * self.atoms).sum(2)


def project(next_pmfs, rewards, terminations, atoms, gamma):
    """Project the distribution of r + gamma * (1 - terminated) * z onto the fixed atoms z."""
    v_min, v_max = atoms[0], atoms[-1]
    delta_z = atoms[1] - atoms[0]
    tz = (rewards.unsqueeze(1) + gamma * atoms.unsqueeze(0) * (1 - terminations.unsqueeze(1))).clamp(v_min, v_max)
    b = (tz - v_min) / delta_z
    lower, upper = b.floor().clamp(0, len(atoms) - 1), b.ceil().clamp(0, len(atoms) - 1)
    # When b lands exactly on an atom, lower == upper and that atom gets the whole mass.
    d_lower = (upper + (lower == upper).float() - b) * next_pmfs
    d_upper = (b - lower) * next_pmfs
    target = torch.zeros_like(next_pmfs)
    target.scatter_add_(1, lower.long(), d_lower)
    target.scatter_add_(1, upper.long(), d_upper)
    return target


def linear_schedule(start_e: float, end_e: float, duration: float, t: int):
    slope = (end_e - start_e) / max(duration, 1)
    return max(slope * t + start_e, end_e)


if __name__ == "__main__":
    args = tyro.cli(Args)
    args.num_iterations = args.total_timesteps // args.num_envs
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
    envs = gym.vector.AsyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(args.num_envs)], shared_memory=True
    )
    envs.action_space.seed(args.seed)

    q_network = QNetwork(envs, args.n_atoms, args.v_min, args.v_max).to(device)
    # eps = 0.01 / batch size, as in the C51 paper's Adam settings
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=0.01 / args.batch_size)
    target_network = QNetwork(envs, args.n_atoms, args.v_min, args.v_max).to(device)
    target_network.load_state_dict(q_network.state_dict())

    rb = AtariFrameBuffer(args.buffer_size, args.num_envs, frame_shape=envs.single_observation_space.shape[1:])
    print(f"replay buffer: {rb.capacity} transitions, {rb.nbytes / 2**30:.2f} GiB", flush=True)

    if args.checkpoint_buffer:
        print(f"warning: --checkpoint-buffer adds up to {rb.nbytes / 2**30:.2f} GiB to every checkpoint", flush=True)
    global_step, start_iteration = 0, 1
    if resume_state is not None:
        q_network.load_state_dict(resume_state["q_network"])
        target_network.load_state_dict(resume_state["target_network"])
        optimizer.load_state_dict(resume_state["optimizer"])
        set_rng_state(resume_state["rng"][0])
        global_step, start_iteration = resume_state["global_step"], resume_state["iteration"] + 1
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
                "q_network": q_network.state_dict(),
                "target_network": target_network.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": [rng_state()],
                **({"replay_buffer": rb.state_dict()} if args.checkpoint_buffer else {}),
            },
            run_dir,
            keep=args.keep_checkpoints,
        )

    stop = StopRequest().install()
    start_time, start_step = time.time(), global_step
    progress = Progress(args.total_timesteps, start_step=global_step)
    num_updates = 0
    # Emulator states are not checkpointed: a resumed run starts new episodes, seeded apart from the first ones.
    obs, _ = envs.reset(seed=args.seed + global_step)
    iteration = start_iteration - 1
    for iteration in range(start_iteration, args.num_iterations + 1):
        previous_step, global_step = global_step, global_step + args.num_envs
        # ALGO LOGIC: put action logic here
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        if random.random() < epsilon:
            actions = envs.action_space.sample()
        else:
            with torch.no_grad():
                actions = q_network(torch.as_tensor(obs, device=device)).argmax(dim=1).cpu().numpy()

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

        # ALGO LOGIC: training. Counted in global steps, so the update ratio does not depend on num_envs.
        if global_step > args.learning_starts and rb.size >= args.batch_size:
            for _ in range(global_step // args.train_frequency - previous_step // args.train_frequency):
                data = rb.sample(args.batch_size, rng, device)
                with torch.no_grad():
                    _, next_pmfs = target_network.get_action(data.next_observations)
                    target_pmfs = project(next_pmfs, data.rewards, data.terminations, target_network.atoms, args.gamma)
                _, old_pmfs = q_network.get_action(data.observations, data.actions.long().flatten())
                loss = (-(target_pmfs * old_pmfs.clamp(min=1e-5, max=1 - 1e-5).log()).sum(-1)).mean()
                if not torch.isfinite(loss):
                    exit_non_finite(global_step, iteration, run_dir, script)

                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                num_updates += 1

                if num_updates % 10 == 0:
                    sps = int((global_step - start_step) / (time.time() - start_time))
                    writer.add_scalar("losses/loss", loss.item(), global_step)
                    writer.add_scalar("losses/q_values", (old_pmfs * q_network.atoms).sum(1).mean().item(), global_step)
                    writer.add_scalar("charts/SPS", sps, global_step)

            # update target network
            if global_step // args.target_network_frequency != previous_step // args.target_network_frequency:
                for target_param, q_param in zip(target_network.parameters(), q_network.parameters(), strict=True):
                    target_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * target_param.data)

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

    if not all(torch.isfinite(p).all() for p in q_network.parameters()):
        exit_non_finite(global_step, iteration, run_dir, script)
    if args.checkpoint_frequency > 0:
        write_checkpoint(iteration, global_step)  # the final state: a retry of a finished run has nothing to do

    progress.close()
    if args.save_model:
        model_path = f"{run_dir}/{args.exp_name}.cleanrl_model"
        atomic_torch_save(
            {"script": script, "env_id": args.env_id, "args": vars(args), "model_state_dict": q_network.state_dict()},
            model_path,
        )
        print(f"model saved to {model_path}")
        episodic_returns = evaluate(
            model_path,
            make_env,
            args.env_id,
            args.eval_episodes,
            f"{run_name}-eval",
            QNetwork,
            device,
            capture_video=args.capture_video,
            epsilon=args.eval_epsilon,
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
