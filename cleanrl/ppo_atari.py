"""PPO on Atari with the Nature CNN (BreakoutNoFrameskip-v4 by default).

Proximal Policy Optimization (Schulman et al. 2017) with GAE, clipped value loss, advantage
normalisation, linear learning-rate annealing, and the DQN-style Atari preprocessing of
``cleanrl_utils.atari_wrappers`` (no-op starts, frame skip 4 with max-pooling, episodic life,
fire on reset, reward clipping, 84x84 grayscale, 4-frame stack). The environments step in
subprocess workers (gymnasium ``AsyncVectorEnv`` with shared memory), so emulation runs in
parallel with no GIL contention. Episode statistics are those of the real game (all lives,
unclipped rewards).

Time limits: the vector env resets a finished sub-env within the same ``step`` call
(``AutoresetMode.SAME_STEP``), so every stored row is a real transition; a *truncated* episode is
bootstrapped from the value of its final observation (``infos["final_obs"]``), a *terminated*
one is not (see ``compute_gae``).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Literal

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
    eval_episodes: int = 10
    """episodes of evaluation after --save-model (actions sampled from the policy)"""
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

    # Throughput arguments (docs/benchmarks/throughput.md measures each)
    channels_last: bool = True
    """NHWC memory layout for the CNN and its input: the same fp32 arithmetic, faster convolutions on CPU"""
    bf16: bool = False
    """bfloat16 autocast for the network's forward passes (CPUs with AVX512-BF16/AMX, or CUDA); changes numerics"""
    env_groups: int = 1
    """step the envs in this many groups, alternately: the policy acts for one group while the others step"""
    env_backend: Literal["gymnasium", "ale"] = "gymnasium"
    """`gymnasium`: the wrappers of make_env in subprocess workers; `ale`: ale_py's C++ vector env, 3x the env steps/s (see AleVecEnv)"""
    compile: bool = False
    """torch.compile the minibatch loss and its backward pass, for GPUs (no gain on the project's CPU: 0.99x; 10-20 s of compiling)"""

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
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
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
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    for name in (*positive, "eval_episodes", "env_groups"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not 0.0 < args.gamma <= 1.0 or not 0.0 <= args.gae_lambda <= 1.0:
        fail("--gamma must be in (0, 1] and --gae-lambda in [0, 1]")
    if args.batch_size % args.num_minibatches != 0:
        fail(
            f"num_envs * num_steps = {args.batch_size} is not divisible by --num-minibatches {args.num_minibatches}; "
            "change --num-envs, --num-steps or --num-minibatches"
        )
    if args.num_envs % args.env_groups != 0:
        fail(f"--env-groups {args.env_groups} does not divide --num-envs {args.num_envs}")
    if args.env_backend == "ale" and args.capture_video:
        fail("--capture-video needs --env-backend gymnasium (the ALE vector env renders no video)")
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
        fail(f"{args.env_id} is not an Atari (ALE) environment; ppo_atari.py needs one, e.g. BreakoutNoFrameskip-v4")


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
    if resume_state is not None:
        saved = resume_state["args"]
        for key in ("env_id", "num_envs", "num_steps"):
            if saved[key] != getattr(args, key):
                fail(
                    f"the checkpoint has --{key.replace('_', '-')} {saved[key]}, this run {getattr(args, key)}; resume with the same"
                )
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

    # env setup: subprocess workers (or ALE's threads), in --env-groups groups of equal size
    group_size = args.num_envs // args.env_groups
    if args.env_backend == "ale":
        env_groups = [AleVecEnv(args.env_id, group_size, num_threads=0) for _ in range(args.env_groups)]
    else:
        env_groups = [
            gym.vector.AsyncVectorEnv(
                [make_env(args.env_id, g * group_size + i, args.capture_video, run_name) for i in range(group_size)],
                shared_memory=True,
                autoreset_mode=AutoresetMode.SAME_STEP,
            )
            for g in range(args.env_groups)
        ]
    group_slices = [slice(g * group_size, (g + 1) * group_size) for g in range(args.env_groups)]
    envs = env_groups[0]  # the spaces of one env are those of all
    envs.action_space.seed(args.seed)

    agent = Agent(envs).to(device)
    if args.channels_last:
        agent = agent.to(memory_format=torch.channels_last)
        agent.channels_last = True
    # bf16 autocast around every forward pass; the backward pass follows the forward's dtypes.
    autocast = functools.partial(torch.autocast, device.type, dtype=torch.bfloat16, enabled=args.bf16)
    # fused: one kernel for all parameters (3.8x less time per step than the loop here, same math up to rounding)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    loss_fn = torch.compile(ppo_loss) if args.compile else ppo_loss
    # With bf16 the rollout acts with a bf16 copy of the weights, refreshed once per iteration, instead of
    # autocast casting all of them again at every step: the same outputs, a third less time per step.
    acting_agent = copy.deepcopy(agent).to(torch.bfloat16) if args.bf16 else agent

    # ALGO Logic: Storage setup
    # Frames are stored as the network's input, converted once when they arrive: scaled to [0, 1],
    # channels-last with --channels-last, bf16 with --bf16 (the values autocast would cast them to).
    # The update reads each frame in 4 epochs without converting it again (1.15x SPS with --bf16 --env-backend ale).
    input_dtype = torch.bfloat16 if args.bf16 else torch.float32
    shape = (args.num_steps, args.num_envs)
    obs = frame_storage(shape, envs.single_observation_space.shape, input_dtype, args.channels_last, device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    terminations = torch.zeros((args.num_steps, args.num_envs)).to(device)
    truncations = torch.zeros((args.num_steps, args.num_envs)).to(device)
    final_values = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

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
    # Emulator states are not checkpointed: a resumed run starts new episodes, seeded apart from the first ones.
    # Group g holds envs g*group_size.., seeded as if they were one vector env.
    next_obs = torch.cat(
        [
            torch.as_tensor(group.reset(seed=args.seed + global_step + sl.start)[0], device=device)
            for group, sl in zip(env_groups, group_slices, strict=True)
        ]
    )
    next_obs = torch.as_tensor(next_obs, device=device)

    for iteration in range(start_iteration, args.num_iterations + 1):
        # Annealing the rate if instructed to do so.
        if args.bf16:
            acting_agent.load_state_dict(agent.state_dict())
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = agent.preprocess(next_obs)

            # ALGO LOGIC: action logic. Act for each group and send it stepping at once: with several
            # groups, the emulators of one group run in their workers while the policy acts for the next.
            for group, sl in zip(env_groups, group_slices, strict=True):
                with torch.inference_mode(), autocast():
                    action, logprob, _, value = acting_agent.get_action_and_value(obs[step, sl])
                values[step, sl] = value.flatten()
                actions[step, sl] = action.to(actions.dtype)
                logprobs[step, sl] = logprob
                group.step_async(action.cpu().numpy())

            # TRY NOT TO MODIFY: execute the game and log data.
            for group, sl in zip(env_groups, group_slices, strict=True):
                next_obs_np, reward, terminated, truncated, infos = group.step_wait()
                rewards[step, sl] = torch.as_tensor(reward, dtype=torch.float32, device=device)
                terminations[step, sl] = torch.as_tensor(terminated, dtype=torch.float32, device=device)
                truncations[step, sl] = torch.as_tensor(truncated, dtype=torch.float32, device=device)
                final_values[step, sl] = 0.0
                # The sub-envs that ended were already reset: `next_obs_np` holds their first observation
                # of the next episode, and `final_obs` the last one of the finished episode.
                bootstrap_idx = np.nonzero(truncated & ~terminated)[0]
                if len(bootstrap_idx) > 0:
                    final_obs = torch.as_tensor(np.stack(infos["final_obs"][bootstrap_idx]), device=device)
                    with torch.inference_mode(), autocast():
                        final_values[step, sl.start + bootstrap_idx] = acting_agent.get_value(final_obs).flatten()
                next_obs[sl] = torch.as_tensor(next_obs_np, device=device)

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
        with torch.no_grad(), autocast():
            next_value = acting_agent.get_value(next_obs).reshape(1, -1)[0]
            advantages, returns = compute_gae(
                rewards, values, terminations, truncations, final_values, next_value, args.gamma, args.gae_lambda
            )

        # flatten the batch
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape).long()
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

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
        for group in env_groups:
            group.close()
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
            {"script": "ppo_atari", "env_id": args.env_id, "args": vars(args), "model_state_dict": agent.state_dict()},
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

    for group in env_groups:
        group.close()
    writer.close()
    if args.track:
        wandb.finish()
    if args.upload_model:
        from cleanrl_utils.huggingface import push_run

        push_run(args, run_name, model_path, episodic_returns, __file__)
