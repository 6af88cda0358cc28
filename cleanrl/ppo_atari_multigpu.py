"""Data-parallel PPO on Atari: one agent trained by N processes (GPUs or CPU slots), launched by torchrun.

    python cleanrl/ppo_atari_multigpu.py                                         # one process
    torchrun --standalone --nproc_per_node=2 cleanrl/ppo_atari_multigpu.py       # one node
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_addr=HOST --master_port=29500 \\
        cleanrl/ppo_atari_multigpu.py                                            # first of two nodes

Every process steps its own ``local_num_envs`` Atari envs in subprocess workers and collects its
own rollout; the gradients of each minibatch are averaged over all processes with one
``all_reduce`` (on one CPU node: one sum through shared memory), so all processes take the same
optimizer step and hold identical parameters (checked at the end: each rank prints a checksum of
its parameters). The global batch is
``num_steps * local_num_envs * world_size``; ``num_minibatches`` is the number of optimizer steps
per epoch, each on a global minibatch made of one local minibatch per process. With the same
global envs this is the same algorithm as ``ppo_atari.py``.

What makes it correct across processes and nodes: the global rank comes from ``RANK`` (not
``LOCAL_RANK``); environment seeds are distinct over all processes of all nodes; rank 0's initial
parameters are broadcast to all; target-KL early stopping uses the KL averaged over processes, so
every process runs the same number of minibatches; the episodes of all processes are gathered to
rank 0 for logging and the losses are averaged. Only rank 0 writes TensorBoard, W&B, videos and
the model.
"""

from __future__ import annotations

import copy
import datetime
import functools
import hashlib
import mmap
import os
import random
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
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
from cleanrl_utils.distributed import init_process_group, torch_threads_per_process
from cleanrl_utils.evals import evaluate
from cleanrl_utils.io import atomic_torch_save
from cleanrl_utils.progress import Progress


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (process r seeds its envs from seed + r * local_num_envs)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available (one GPU per local process)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases (rank 0 only)"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (rank 0's env 0, `videos/<run_name>`)"""
    save_model: bool = False
    """whether to save the model to `runs/<run_name>/<exp_name>.cleanrl_model` and evaluate it (rank 0)"""
    eval_episodes: int = 10
    """episodes of evaluation after --save-model (actions sampled from the policy)"""
    upload_model: bool = False
    """whether to upload the saved model, its evaluation and video to the Hugging Face Hub (needs --save-model)"""
    hf_entity: str = ""
    """the user or org name of the model repository on the Hugging Face Hub"""
    run_name: str | None = None
    """the run folder under runs/ (default `{env_id}__{exp_name}__{seed}__{torchrun run id or unix_time}`)"""
    checkpoint_frequency: int = 100
    """write a checkpoint every N iterations to runs/<run_name>/checkpoints (0: only on SIGTERM/SIGINT)"""
    keep_checkpoints: int = 3
    """how many of the newest checkpoints to keep"""
    resume: str | None = None
    """a checkpoint file, or `auto`: the newest checkpoint of the run (the default under torchrun; fresh if none)"""

    # Distributed arguments
    backend: Literal["gloo", "nccl"] | None = None
    """torch.distributed backend: default nccl when each process has its own GPU, else gloo"""
    device_ids: list[int] | None = None
    """CUDA device id for each local process, one per process on this node (default: local rank modulo GPU count)"""
    dist_timeout: int = 600
    """seconds a collective waits for the other processes before failing, so that a lost node ends the attempt"""
    torch_threads: int = 0
    """intra-op CPU threads per process; 0 = an exported OMP_NUM_THREADS, else cores // local processes"""
    grad_allreduce: Literal["auto", "shared-memory", "backend"] = "auto"
    """how gradients are summed: `backend` = the backend's all_reduce; `shared-memory` = through a shared array (CPU, all processes on one node); `auto` = shared-memory where it applies"""

    # Throughput arguments (docs/benchmarks/throughput.md measures each)
    channels_last: bool = True
    """NHWC memory layout for the CNN and its input: the same fp32 arithmetic, faster convolutions on CPU"""
    bf16: bool = False
    """bfloat16 autocast for the network's forward passes (CPUs with AVX512-BF16/AMX, or CUDA); changes numerics"""
    env_groups: int = 1
    """step the local envs in this many groups, alternately: the policy acts for one group while the others step"""
    env_backend: Literal["gymnasium", "ale"] = "gymnasium"
    """`gymnasium`: the wrappers of make_env in subprocess workers; `ale`: ale_py's C++ vector env, 3x the env steps/s (see AleVecEnv)"""
    compile: bool = False
    """torch.compile the minibatch loss and its backward pass, for GPUs (no gain on the project's CPU: 0.99x; 10-20 s of compiling)"""

    # Algorithm specific arguments
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the Atari environment (`<Game>NoFrameskip-v4`, or `ALE/<Game>-v5` with its sticky actions)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment (summed over all envs of all processes)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    local_num_envs: int | None = None
    """the number of envs per process (default 8 when --num-envs is not given)"""
    num_envs: int | None = None
    """the global number of envs, split evenly across processes (give this or --local-num-envs)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (optimizer steps per epoch; each process contributes 1/N of each)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization (per local minibatch)"""
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
    """the target KL divergence threshold (decided on the KL averaged over all processes)"""

    # to be filled in runtime
    world_size: int = 0
    """the number of processes (computed in runtime)"""
    local_batch_size: int = 0
    """the batch size of one process (computed in runtime)"""
    local_minibatch_size: int = 0
    """the mini-batch size of one process (computed in runtime)"""
    batch_size: int = 0
    """the global batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the global mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def fail(message: str, rank: int = 0) -> None:
    """Bad input: one line on stderr (from rank 0 only) and exit status 2, before anything is written."""
    if rank == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def resolve_sizes(args: Args, world_size: int, rank: int) -> None:
    """Derive per-process and global sizes; `--num-envs` is global, `--local-num-envs` per process."""
    if args.num_envs is not None and args.local_num_envs is not None:
        fail(
            "give either --num-envs (global, split across processes) or --local-num-envs (per process), not both", rank
        )
    if args.num_envs is not None:
        if args.num_envs <= 0 or args.num_envs % world_size != 0:
            fail(f"--num-envs {args.num_envs} must be a positive multiple of the {world_size} processes", rank)
        args.local_num_envs = args.num_envs // world_size
    elif args.local_num_envs is None:
        args.local_num_envs = 8
    args.world_size = world_size
    args.num_envs = args.local_num_envs * world_size
    args.local_batch_size = args.local_num_envs * args.num_steps
    args.local_minibatch_size = args.local_batch_size // max(1, args.num_minibatches)
    args.batch_size = args.local_batch_size * world_size
    args.minibatch_size = args.local_minibatch_size * world_size
    args.num_iterations = args.total_timesteps // max(1, args.batch_size)


def validate(args: Args, rank: int, local_world_size: int) -> None:
    positive = ("total_timesteps", "local_num_envs", "num_steps", "num_minibatches", "update_epochs")
    for name in (*positive, "eval_episodes", "env_groups"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}", rank)
    if not 0.0 < args.gamma <= 1.0 or not 0.0 <= args.gae_lambda <= 1.0:
        fail("--gamma must be in (0, 1] and --gae-lambda in [0, 1]", rank)
    if args.local_batch_size % args.num_minibatches != 0:
        fail(
            f"local_num_envs * num_steps = {args.local_batch_size} is not divisible by --num-minibatches "
            f"{args.num_minibatches}; change --local-num-envs/--num-envs, --num-steps or --num-minibatches",
            rank,
        )
    if args.local_num_envs % args.env_groups != 0:
        fail(f"--env-groups {args.env_groups} does not divide the {args.local_num_envs} envs of a process", rank)
    if args.env_backend == "ale" and args.capture_video:
        fail("--capture-video needs --env-backend gymnasium (the ALE vector env renders no video)", rank)
    if args.num_iterations < 1:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one global rollout "
            f"(num_envs * num_steps = {args.batch_size})",
            rank,
        )
    if args.upload_model and not args.save_model:
        fail("--upload-model uploads the saved model: add --save-model", rank)
    if args.checkpoint_frequency < 0 or args.keep_checkpoints < 1:
        fail("--checkpoint-frequency must be >= 0 and --keep-checkpoints >= 1", rank)
    if args.dist_timeout <= 0:
        fail("--dist-timeout must be positive (seconds)", rank)
    use_cuda, device_ids = cuda_devices(args, local_world_size)
    if args.backend == "nccl" and not use_cuda:
        fail(
            "--backend nccl needs CUDA, which is not available here (or --no-cuda was given); use --backend gloo", rank
        )
    if args.device_ids is not None and len(args.device_ids) != local_world_size:
        fail(
            f"--device-ids lists {len(args.device_ids)} ids but this node runs {local_world_size} processes "
            "(give one id per process)",
            rank,
        )
    if args.device_ids is not None and not use_cuda:
        fail("--device-ids was given but CUDA is not used (not available, or --no-cuda)", rank)
    if args.grad_allreduce == "shared-memory" and (use_cuda or args.world_size != local_world_size):
        fail(
            "--grad-allreduce shared-memory needs CPU training (--no-cuda) with all processes on one node; "
            "use --grad-allreduce auto or backend",
            rank,
        )
    if use_cuda:
        if any(not 0 <= d < torch.cuda.device_count() for d in device_ids):
            fail(f"--device-ids {device_ids}: this node has {torch.cuda.device_count()} CUDA devices", rank)
        if args.backend == "nccl" and len(set(device_ids)) != len(device_ids):
            fail(
                f"NCCL needs one GPU per process, but processes share GPUs (devices {device_ids}); "
                "use --backend gloo or fewer processes per node",
                rank,
            )
    gym.register_envs(ale_py)
    try:
        spec = gym.spec(args.env_id)
    except gym.error.Error as e:
        fail(f"unknown environment id {args.env_id!r} ({type(e).__name__}: {e})", rank)
    if not str(spec.entry_point).startswith("ale_py"):
        fail(
            f"{args.env_id} is not an Atari (ALE) environment; this script needs one, e.g. BreakoutNoFrameskip-v4", rank
        )


def cuda_devices(args: Args, local_world_size: int) -> tuple[bool, list[int]]:
    """Whether CUDA is used, and the device of each local process (round-robin when GPUs are fewer)."""
    if not (args.cuda and torch.cuda.is_available()):
        return False, []
    if args.device_ids is not None:
        return True, list(args.device_ids)
    return True, [i % torch.cuda.device_count() for i in range(local_world_size)]


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


class AleVecEnv:
    """`--env-backend ale`: ale_py's vector env, made to behave as the AsyncVectorEnv of make_env here.

    The emulators and the preprocessing run in C++ on threads of this process (no subprocesses, no
    pickling, the GIL released while they step), 3x the steps/s of the wrapper stack on the project's CPU.
    Kept from make_env: 30 no-op starts, frame skip 4 with a max over the last two frames, 84x84
    grayscale, a stack of 4, FIRE at reset, a lost life ends the episode for learning
    (``terminated``) while the game goes on, rewards clipped to their sign, and episode statistics
    of whole games with unclipped rewards. FIRE after a lost life: make_env presses it in hidden
    steps (EpisodicLifeEnv's no-op, then FireResetEnv's FIRE and action 2); here the first step
    after a lost life sends FIRE in place of the agent's action (the agent's sampled action is still
    what is stored: it simply has no effect there, as on a reset step), so no game stalls waiting
    for the agent to relaunch the ball. Other differences (docs/benchmarks/throughput.md): grayscale
    and resizing are ALE's, not OpenCV's; episode lengths are the emulator's frame counter; no video.
    ALE's own ``episodic_life`` restarts the whole game at every lost life, which is why lives are
    followed here instead.
    """

    def __init__(self, env_id, num_envs, num_threads):
        from ale_py.vector_env import AtariVectorEnv

        spec = gym.spec(env_id).kwargs  # the game and the emulator settings of the registered id
        self.envs = AtariVectorEnv(
            spec["game"],
            num_envs,
            num_threads=num_threads,
            autoreset_mode=AutoresetMode.SAME_STEP,
            repeat_action_probability=spec.get("repeat_action_probability", 0.0),
            full_action_space=spec.get("full_action_space", False),
            max_num_frames_per_episode=spec.get("max_num_frames_per_episode", 108_000),
            frameskip=4,
            maxpool=True,
            noop_max=30,
            use_fire_reset=True,
            img_height=84,
            img_width=84,
            grayscale=True,
            stack_num=4,
            episodic_life=False,
            reward_clipping=False,
        )
        self.num_envs = num_envs
        self.single_observation_space = self.envs.single_observation_space
        self.single_action_space = self.envs.single_action_space
        self.action_space = self.envs.action_space
        self.returns = np.zeros(num_envs)  # unclipped return of the game so far
        names = [action.name for action in self.envs.ale.get_action_set()]
        self.fire = names.index("FIRE") if "FIRE" in names else None
        self.fire_next = np.zeros(num_envs, dtype=bool)  # envs that lost a life at their last step

    def reset(self, seed=None):
        obs, info = self.envs.reset(seed=seed)
        self.lives, self.frames = info["lives"].copy(), info["episode_frame_number"].copy()
        self.returns[:] = 0.0
        self.fire_next[:] = False
        return obs, {}

    def step_async(self, actions):
        if self.fire is not None and self.fire_next.any():
            actions = np.where(self.fire_next, self.fire, actions)
        self.envs.send(actions)

    def step_wait(self):
        obs, reward, terminated, truncated, info = self.envs.recv()
        assert (info["env_id"] == np.arange(self.num_envs)).all(), "ALE answered out of order"
        game_over = terminated | truncated
        self.returns += reward
        life_lost = (info["lives"] < self.lives) & ~game_over
        infos = {}
        if game_over.any():
            # As RecordEpisodeStatistics under the other wrappers: the whole game, rewards unclipped.
            infos["final_obs"] = info["final_obs"]
            infos["final_info"] = {
                "episode": {"r": np.where(game_over, self.returns, 0.0), "l": np.where(game_over, self.frames + 4, 0)},
                "_episode": game_over,
            }
            self.returns[game_over] = 0.0
        self.lives, self.frames = info["lives"].copy(), info["episode_frame_number"].copy()
        self.fire_next = life_lost
        return obs, np.sign(reward).astype(np.float32), terminated | life_lost, truncated, infos

    def close(self):
        self.envs.close()


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        # The Nature DQN torso (Mnih et al. 2015) shared by the actor and the critic.
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, envs.single_action_space.n), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    channels_last = False  # set with the module's memory format: preprocess() lays the input out to match

    def preprocess(self, frames):
        """uint8 frames -> the network's input: scaled to [0, 1] (exactly frames / 255.0), in the module's layout."""
        if self.channels_last:
            # Reordered while still uint8 (a quarter of the bytes to move); float() and div_ keep the layout.
            frames = frames.contiguous(memory_format=torch.channels_last)
        # The same values as frames / 255.0, which is slower here (4.7 vs 3.8 ms per minibatch of 128).
        return frames.float().div_(255.0)

    def features(self, x):
        """x: uint8 frames, or frames already preprocessed (the rollout storage holds those)."""
        return self.network(self.preprocess(x) if x.dtype == torch.uint8 else x)

    def get_value(self, x):
        return self.critic(self.features(x)).float()

    def get_action_and_value(self, x, action=None):
        hidden = self.features(x)
        # Under bf16 autocast the heads return bf16; the distribution and the losses stay fp32.
        logits = self.actor(hidden).float()
        # No argument validation: NaNs are reported by the gradient-norm check with a clear message.
        probs = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden).float()


def frame_storage(batch_shape, frame_shape, dtype, channels_last, device):
    """Zeros for a batch of preprocessed frame stacks (C, H, W). With channels_last each stack is laid
    out channels-innermost, so that storage[step] and the flattened batch are channels_last tensors
    the network reads without a reorder."""
    if not channels_last:
        return torch.zeros(batch_shape + frame_shape, dtype=dtype, device=device)
    c, h, w = frame_shape
    return torch.zeros(batch_shape + (h, w, c), dtype=dtype, device=device).movedim(-1, len(batch_shape))


def compute_gae(rewards, values, terminations, truncations, final_values, next_value, gamma, gae_lambda):
    """Generalised advantage estimates for a rollout of shape (num_steps, num_envs).

    Row t holds the transition s_t -> s_{t+1}: ``rewards[t]``, ``values[t]`` = V(s_t), and whether it
    ended the episode by termination or truncation. ``final_values[t]`` is V(final observation) of a
    truncated transition; ``next_value`` is V of the observation after the last row.
    After a termination the bootstrap value is 0; after a truncation it is the value of the final
    observation; otherwise it is V(s_{t+1}). The lambda-chain is cut at every episode end.
    """
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


def ppo_loss(agent, args, obs, actions, old_logprobs, advantages, returns, old_values):
    """The PPO loss of one minibatch: clipped surrogate, clipped value loss and entropy bonus.

    Returns the loss, its parts, and the log-ratio and ratio of new to old action probabilities
    (for the KL diagnostics). One plain function, so that `--compile` hands all of it to
    torch.compile; the backward pass then runs through the compiled graph as well.
    """
    with torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=args.bf16):
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    logratio = newlogprob - old_logprobs
    ratio = logratio.exp()

    if args.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    # Policy loss
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss
    newvalue = newvalue.view(-1)
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = old_values + torch.clamp(newvalue - old_values, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    return loss, pg_loss, v_loss, entropy_loss, logratio, ratio


class SharedMemoryUnavailable(RuntimeError):
    """Raised on every process when SharedMemorySum cannot reserve its shared array."""


class SharedMemorySum:
    """Sum a flat CPU tensor over the processes of one node through shared memory, in place.

    gloo's all_reduce of the 6.7 MB gradient goes through loopback TCP: 5.5 ms when idle and 7-11 ms
    in training on the project's 2-core CPU. Here each process copies its tensor into its own row of
    a shared array, one 1-element all_reduce waits until every row is written, and each process adds
    the rows in rank order: 2 ms, and the same sum, to the bit, in every process (for 2 processes
    also the same bits as gloo's). Two sets of rows are used alternately: a fast process writes call
    k+1 into the other set while a slow one may still read call k, and it can only reach call k+2
    after every process has waited in call k+1, that is after every process has finished reading
    call k. A process that dies makes the others fail in the waiting all_reduce, as with gloo.
    The pages are reserved when the array is made: on a full /dev/shm (Docker's default is 64 MB)
    every process raises SharedMemoryUnavailable then, instead of dying of SIGBUS mid-training.
    """

    def __init__(self, numel, dtype, rank, world_size):
        self.rank, self.world_size, self.calls = rank, world_size, 0
        nbytes = 2 * world_size * numel * torch.empty((), dtype=dtype).element_size()
        path, reason = None, None
        if rank == 0:  # a file in /dev/shm (memory), unlinked as soon as every process has mapped it
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
            path = os.path.join(folder, f"cleanrl-grads-{os.getpid()}-{secrets.token_hex(4)}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:  # allocate the pages now, not at the first write into a sparse file
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(fd, 0, nbytes)
                else:
                    os.ftruncate(fd, nbytes)
            except OSError as e:
                os.close(fd)
                os.unlink(path)
                stat = os.statvfs(folder)
                reason = (
                    f"cannot reserve {nbytes / 1e6:.1f} MB in {folder} for the gradient sum "
                    f"({e.strerror}; {stat.f_bavail * stat.f_frsize / 1e6:.1f} MB free)"
                )
                path = None
        holder = [path, reason]
        dist.broadcast_object_list(holder, src=0)
        self.path, reason = holder
        if self.path is None:
            raise SharedMemoryUnavailable(reason)
        try:
            if rank != 0:
                fd = os.open(self.path, os.O_RDWR)
            self.mapping = mmap.mmap(fd, nbytes)
            os.close(fd)
            self.rows = torch.frombuffer(self.mapping, dtype=dtype).view(2, world_size, numel)
            dist.barrier()
        finally:
            if rank == 0:
                os.unlink(path)
        self.ready = torch.zeros(1)

    def sum_(self, flat):
        rows = self.rows[self.calls % 2, :, : flat.numel()]
        self.calls += 1
        rows[self.rank].copy_(flat)
        dist.all_reduce(self.ready)  # returns when every process has written its row
        torch.add(rows[0], rows[1], out=flat)
        for r in range(2, self.world_size):
            flat.add_(rows[r])


def all_reduce_gradients(parameters, world_size, buffer=None, shared_sum=None):
    """Average the gradients over all processes with a single all_reduce on one flat buffer.

    buffer: optional, at least as long as all the gradients together. Reusing one instead of a new
    6.7 MB tensor at every minibatch saved 0.6-2.1 ms of a 7.8-10.4 ms all_reduce on the project's
    CPU (benchmark/allreduce_buffer.py). shared_sum: a SharedMemorySum to use instead of the
    backend's all_reduce.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    numel = sum(g.numel() for g in grads)
    flat = torch.empty(numel, dtype=grads[0].dtype, device=grads[0].device) if buffer is None else buffer[:numel]
    torch.cat([g.reshape(-1) for g in grads], out=flat)
    if shared_sum is not None:
        shared_sum.sum_(flat)
    else:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        torch.div(flat[offset : offset + g.numel()].view_as(g), world_size, out=g)
        offset += g.numel()


def parameter_checksum(module):
    digest = hashlib.sha256()
    for p in module.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


if __name__ == "__main__":
    args = tyro.cli(Args)
    # torchrun sets these; a plain `python` launch is one process without a process group.
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    resolve_sizes(args, world_size, rank)
    validate(args, rank, local_world_size)

    use_cuda, device_ids = cuda_devices(args, local_world_size)
    if use_cuda:
        device = torch.device("cuda", device_ids[local_rank])
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # NCCL when every process has a GPU of its own; gloo on CPU or when processes share a GPU.
    backend = args.backend or ("nccl" if use_cuda and len(set(device_ids)) == len(device_ids) else "gloo")
    # Gradients summed in shared memory when all processes are on this node and on CPU (see SharedMemorySum).
    one_node_cpu = distributed and world_size > 1 and world_size == local_world_size and not use_cuda
    grad_sum_shm = args.grad_allreduce != "backend" and one_node_cpu
    threads, threads_reason = torch_threads_per_process(local_world_size, args.torch_threads)
    torch.set_num_threads(threads)
    if distributed:
        init_process_group(backend, datetime.timedelta(seconds=args.dist_timeout))
    elif rank == 0:
        print("note: one process, no process group; launch with `torchrun --nproc_per_node=N` for data parallelism")

    # The run folder must be the same after torchrun restarts the group: an explicit --run-name,
    # else torchrun's run id (fixed for one launch, restarts included), else rank 0's start time.
    script = os.path.basename(__file__)[: -len(".py")]
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if args.run_name:
        run_name = args.run_name
    elif distributed and run_id != "none":
        run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{run_id}"
    else:
        run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        if distributed and rank == 0:
            print("note: no --run-name and no torchrun run id: a restarted group would start a new run folder")
    resume = args.resume if args.resume is not None else ("auto" if distributed else None)
    # Rank 0 reads the checkpoint and sends it to every rank, so nodes need no shared file system.
    resume_state, resume_error = None, None
    if rank == 0:
        try:
            known_run = args.run_name is not None or distributed
            resume_state = find_resume_state(resume, f"runs/{run_name}" if known_run else None, script)
        except CheckpointError as e:
            resume_error = str(e)
    if distributed:
        holder = [run_name, resume_state, resume_error]
        dist.broadcast_object_list(holder, src=0)
        run_name, resume_state, resume_error = holder
    if resume_state is not None and resume_state["args"]["env_id"] != args.env_id:
        resume_error = f"the checkpoint is for {resume_state['args']['env_id']}, not {args.env_id}"
    if resume_error is not None:
        if distributed:
            dist.destroy_process_group()
        fail(resume_error, rank)
    if resume_state is not None:
        run_name = resume_state["run_name"]
    run_dir = f"runs/{run_name}"
    global_step = resume_state["global_step"] if resume_state else 0
    # Resumed envs start new episodes (emulator states are not checkpointed), seeded apart from the first ones.
    env_seed = args.seed + rank * args.local_num_envs + global_step
    # Each process draws its own actions and minibatches; envs get disjoint seeds below.
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # env setup: this process's envs, in subprocess workers (or ALE's threads), in --env-groups groups of equal size
    group_size = args.local_num_envs // args.env_groups
    if args.env_backend == "ale":
        # The emulator threads of a process share its cores with torch: one per torch thread.
        env_groups = [AleVecEnv(args.env_id, group_size, num_threads=threads) for _ in range(args.env_groups)]
    else:
        env_groups = [
            gym.vector.AsyncVectorEnv(
                [
                    make_env(args.env_id, g * group_size + i, args.capture_video and rank == 0, run_name)
                    for i in range(group_size)
                ],
                shared_memory=True,
                autoreset_mode=AutoresetMode.SAME_STEP,
            )
            for g in range(args.env_groups)
        ]
    group_slices = [slice(g * group_size, (g + 1) * group_size) for g in range(args.env_groups)]
    envs = env_groups[0]  # the spaces of one env are those of all
    envs.action_space.seed(env_seed)

    agent = Agent(envs).to(device)
    if args.channels_last:
        agent = agent.to(memory_format=torch.channels_last)
        agent.channels_last = True
    # bf16 autocast around every forward pass; the backward pass follows the forward's dtypes.
    autocast = functools.partial(torch.autocast, device.type, dtype=torch.bfloat16, enabled=args.bf16)
    if distributed:
        # Identical starting point guaranteed by a broadcast, not by seeding.
        for tensor in agent.state_dict().values():
            dist.broadcast(tensor, src=0)
    # fused: one kernel for all parameters (3.8x less time per step than the loop here, same math up to rounding)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    grad_buffer = torch.empty(sum(p.numel() for p in agent.parameters()), device=device)  # for all_reduce_gradients
    shared_sum = None
    if grad_sum_shm:
        try:
            shared_sum = SharedMemorySum(grad_buffer.numel(), grad_buffer.dtype, rank, world_size)
        except SharedMemoryUnavailable as e:
            if args.grad_allreduce == "shared-memory":  # asked for explicitly: stop, on every rank
                dist.destroy_process_group()
                fail(f"--grad-allreduce shared-memory: {e}", rank)
            if rank == 0:
                print(f"note: {e}: gradients summed with {backend}'s all_reduce instead", flush=True)
    # Said, and the run folder made, only now: once the gradient path is settled, so that a run stopped
    # above (no room for --grad-allreduce shared-memory) leaves nothing behind and no line contradicts another.
    print(
        f"rank={rank} local_rank={local_rank} world_size={world_size} pid={os.getpid()} "
        f"restart={os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')} device={device} backend="
        f"{backend if distributed else 'none'}{' (gradients: shared memory)' if shared_sum is not None else ''} "
        f"threads={threads} ({threads_reason}) "
        f"env_seeds={env_seed}..{env_seed + args.local_num_envs - 1}",
        flush=True,
    )

    writer = None
    if rank == 0:
        print(
            f"global: num_envs={args.num_envs} ({args.local_num_envs} per process x {world_size}) "
            f"batch_size={args.batch_size} minibatch_size={args.minibatch_size} iterations={args.num_iterations}",
            flush=True,
        )
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
                id=hashlib.sha1(run_name.encode()).hexdigest()[:16],  # the same W&B run after a restart
                resume="allow",
                save_code=True,
            )
        # A resumed run appends to the same folder; purge_step hides what the interrupted attempt
        # logged after its last checkpoint, so no step appears twice.
        writer = SummaryWriter(run_dir, purge_step=global_step + 1 if resume_state else None)
        writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()),
        )

    loss_fn = torch.compile(ppo_loss) if args.compile else ppo_loss
    # With bf16 the rollout acts with a bf16 copy of the weights, refreshed once per iteration, instead of
    # autocast casting all of them again at every step: the same outputs, a third less time per step.
    acting_agent = copy.deepcopy(agent).to(torch.bfloat16) if args.bf16 else agent
    completed_iteration, completed_step = 0, 0
    if resume_state is not None:
        agent.load_state_dict(resume_state["model"])
        optimizer.load_state_dict(resume_state["optimizer"])
        completed_iteration, completed_step = resume_state["iteration"], resume_state["global_step"]
        if rank < len(resume_state["rng"]):
            set_rng_state(resume_state["rng"][rank])
        else:
            # A process that did not exist when the checkpoint was written (the group grew).
            random.seed(args.seed + rank + global_step)
            np.random.seed(args.seed + rank + global_step)
            torch.manual_seed(args.seed + rank + global_step)
        if rank == 0:
            print(f"resumed from {resume_state['path']} at global_step={global_step}", flush=True)
    resume_state = None  # free the copy

    def write_checkpoint():
        """Collective: every rank sends its RNG states, rank 0 writes."""
        rngs = [rng_state()]
        if distributed:
            rngs = [None] * world_size if rank == 0 else None
            dist.gather_object(rng_state(), rngs, dst=0)
        if rank != 0:
            return None
        return save_checkpoint(
            {
                "script": script,
                "run_name": run_name,
                "args": vars(args),
                "global_step": completed_step,
                "iteration": completed_iteration,
                "model": agent.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": rngs,
                "world_size": world_size,
            },
            run_dir,
            keep=args.keep_checkpoints,
        )

    stop = StopRequest(when="at the end of the current iteration").install()

    # ALGO Logic: Storage setup
    # Frames are stored as the network's input, converted once when they arrive: scaled to [0, 1],
    # channels-last with --channels-last, bf16 with --bf16 (the values autocast would cast them to).
    # The update reads each frame in 4 epochs without converting it again (1.15x SPS with --bf16 --env-backend ale).
    shape = (args.num_steps, args.local_num_envs)
    input_dtype = torch.bfloat16 if args.bf16 else torch.float32
    obs = frame_storage(shape, envs.single_observation_space.shape, input_dtype, args.channels_last, device)
    actions = torch.zeros(shape + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros(shape).to(device)
    rewards = torch.zeros(shape).to(device)
    terminations = torch.zeros(shape).to(device)
    truncations = torch.zeros(shape).to(device)
    final_values = torch.zeros(shape).to(device)
    values = torch.zeros(shape).to(device)

    num_updates = 0
    local_episodes = 0
    stop_now = False
    start_time, start_step = time.time(), global_step
    progress = Progress(args.total_timesteps, start_step=global_step, enabled=rank == 0)
    # Group g holds envs g*group_size.., seeded as if they were one vector env.
    next_obs = torch.cat(
        [
            torch.as_tensor(group.reset(seed=env_seed + sl.start)[0], device=device)
            for group, sl in zip(env_groups, group_slices, strict=True)
        ]
    )

    # Iterate on steps, not on a fixed iteration count: after an elastic restart with a different
    # world size the global batch may differ, and the budget must still hold.
    while completed_step + args.batch_size <= args.total_timesteps:
        iteration = completed_iteration + 1
        if args.bf16:
            acting_agent.load_state_dict(agent.state_dict())
        if args.anneal_lr:
            frac = 1.0 - completed_step / args.total_timesteps
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        finished = []  # (global_step, return, length) of this process's episodes in this rollout
        for step in range(0, args.num_steps):
            # All processes step in lockstep, so global_step counts the envs of every process.
            global_step += args.num_envs
            obs[step] = agent.preprocess(next_obs)
            # Act for each group and send it stepping at once: with several groups, the emulators of
            # one group run in their workers while the policy computes the actions of the next.
            for group, sl in zip(env_groups, group_slices, strict=True):
                with torch.inference_mode(), autocast():
                    action, logprob, _, value = acting_agent.get_action_and_value(obs[step, sl])
                values[step, sl] = value.flatten()
                actions[step, sl] = action.to(actions.dtype)
                logprobs[step, sl] = logprob
                group.step_async(action.cpu().numpy())
            for group, sl in zip(env_groups, group_slices, strict=True):
                next_obs_np, reward, terminated, truncated, infos = group.step_wait()
                rewards[step, sl] = torch.as_tensor(reward, dtype=torch.float32, device=device)
                terminations[step, sl] = torch.as_tensor(terminated, dtype=torch.float32, device=device)
                truncations[step, sl] = torch.as_tensor(truncated, dtype=torch.float32, device=device)
                final_values[step, sl] = 0.0
                # Ended sub-envs were already reset; a truncated one is bootstrapped from its final observation.
                bootstrap_idx = np.nonzero(truncated & ~terminated)[0]
                if len(bootstrap_idx) > 0:
                    final_obs = torch.as_tensor(np.stack(infos["final_obs"][bootstrap_idx]), device=device)
                    with torch.inference_mode(), autocast():
                        final_values[step, sl.start + bootstrap_idx] = acting_agent.get_value(final_obs).flatten()
                next_obs[sl] = torch.as_tensor(next_obs_np, device=device)

                if "final_info" in infos and "episode" in infos["final_info"]:
                    episode = infos["final_info"]["episode"]
                    for i in np.nonzero(infos["final_info"]["_episode"])[0]:
                        finished.append((global_step, float(episode["r"][i]), int(episode["l"][i])))
        local_episodes += len(finished)

        with torch.no_grad(), autocast():
            next_value = acting_agent.get_value(next_obs).reshape(1, -1)[0]
            advantages, returns = compute_gae(
                rewards, values, terminations, truncations, final_values, next_value, args.gamma, args.gae_lambda
            )

        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape).long()
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Each optimizer step uses one local minibatch per process; the averaged gradient is the
        # gradient of the global minibatch.
        b_inds = np.arange(args.local_batch_size)
        clipfracs = []
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.local_batch_size, args.local_minibatch_size):
                mb_inds = b_inds[start : start + args.local_minibatch_size]

                loss, pg_loss, v_loss, entropy_loss, logratio, ratio = loss_fn(
                    agent, args, b_obs[mb_inds], b_actions[mb_inds], b_logprobs[mb_inds],
                    b_advantages[mb_inds], b_returns[mb_inds], b_values[mb_inds],
                )  # fmt: skip

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                optimizer.zero_grad()
                loss.backward()
                if distributed:
                    # Average before clipping, so every process clips the same global gradient.
                    all_reduce_gradients(agent.parameters(), world_size, grad_buffer, shared_sum)
                grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                if not torch.isfinite(grad_norm):
                    exit_non_finite(global_step, iteration, run_dir, script, quiet=rank != 0)
                optimizer.step()
                num_updates += 1

            if args.target_kl is not None:
                # Decide together: a process stopping alone would leave the others waiting in all_reduce.
                mean_kl = approx_kl.detach().clone()
                if distributed:
                    dist.all_reduce(mean_kl, op=dist.ReduceOp.SUM)
                    mean_kl /= world_size
                if mean_kl.item() > args.target_kl:
                    break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # Statistics of all processes: losses averaged, episodes gathered to rank 0.
        stats = torch.tensor(
            [
                v_loss.item(),
                pg_loss.item(),
                entropy_loss.item(),
                old_approx_kl.item(),
                approx_kl.item(),
                float(np.mean(clipfracs)),
                float(explained_var),
            ],
            dtype=torch.float64,
            device=device,
        )
        all_finished = [finished]
        if distributed:
            dist.all_reduce(stats, op=dist.ReduceOp.SUM)
            stats /= world_size
            all_finished = [None] * world_size
            dist.all_gather_object(all_finished, finished)

        if rank == 0:
            for step_of_episode, episodic_return, episodic_length in sorted(e for f in all_finished for e in f):
                writer.add_scalar("charts/episodic_return", episodic_return, step_of_episode)
                progress.episode(episodic_return)
                writer.add_scalar("charts/episodic_length", episodic_length, step_of_episode)
            v_loss_m, pg_loss_m, entropy_m, old_kl_m, kl_m, clipfrac_m, explained_var_m = stats.tolist()
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss_m, global_step)
            writer.add_scalar("losses/policy_loss", pg_loss_m, global_step)
            writer.add_scalar("losses/entropy", entropy_m, global_step)
            writer.add_scalar("losses/old_approx_kl", old_kl_m, global_step)
            writer.add_scalar("losses/approx_kl", kl_m, global_step)
            writer.add_scalar("losses/clipfrac", clipfrac_m, global_step)
            writer.add_scalar("losses/explained_variance", explained_var_m, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            progress.update(global_step)

        # Parameters are identical over ranks, so all ranks take the same decision.
        if not all(torch.isfinite(p).all() for p in agent.parameters()):
            exit_non_finite(global_step, iteration, run_dir, script, quiet=rank != 0)
        completed_iteration, completed_step = iteration, global_step
        # A stop is decided together, so that every rank reaches the same collective calls.
        stop_flag = torch.tensor([1.0 if stop.requested else 0.0], device=device)
        if distributed:
            dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
        stop_now = stop_flag.item() > 0
        if args.checkpoint_frequency > 0 and iteration % args.checkpoint_frequency == 0 and not stop_now:
            write_checkpoint()
        if stop_now:
            break

    if stop_now:
        path = write_checkpoint()
        if rank == 0:
            print(f"stop requested: checkpoint {path} written at global_step={completed_step}; exiting", flush=True)
            writer.close()
            if args.track:
                wandb.finish(exit_code=EXIT_PREEMPTED)
        for group in env_groups:
            group.close()
        if distributed:
            dist.destroy_process_group()
        raise SystemExit(EXIT_PREEMPTED)
    if args.checkpoint_frequency > 0 and completed_iteration % args.checkpoint_frequency != 0:
        write_checkpoint()  # the final state, so that a retry of a finished run has nothing left to do

    progress.close()
    if args.save_model and rank == 0:
        model_path = f"{run_dir}/{args.exp_name}.cleanrl_model"
        atomic_torch_save(
            {
                "script": "ppo_atari_multigpu",
                "env_id": args.env_id,
                "args": vars(args),
                "model_state_dict": agent.state_dict(),
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

    # One line per rank; identical checksums show that all processes hold the same parameters.
    print(
        f"rank={rank} done: updates={num_updates} episodes={local_episodes} param_sha256={parameter_checksum(agent)}",
        flush=True,
    )
    for group in env_groups:
        group.close()
    if writer is not None:
        writer.close()
    if args.track and rank == 0:
        wandb.finish()
    if distributed:
        dist.destroy_process_group()
    if args.upload_model and rank == 0:
        from cleanrl_utils.huggingface import push_run

        push_run(args, run_name, model_path, episodic_returns, __file__)
