"""SAC for discrete actions on Atari with Nature CNN encoders (BreakoutNoFrameskip-v4 by default).

Soft Actor-Critic for discrete actions (Christodoulou 2019): a categorical policy and two
Q-networks that output one value per action, each with its own Nature CNN. With a discrete
policy the expectations over actions are exact sums over the action probabilities (no
reparameterisation): the soft value of s' is ``sum_a pi(a|s') (min Q_target(s', a) - alpha log pi(a|s'))``
and the actor minimises ``sum_a pi(a|s) (alpha log pi(a|s) - min Q(s, a))``. With ``--autotune``
alpha keeps the policy's entropy near ``--target-entropy-scale * log(num_actions)`` (a fraction
of the entropy of the uniform policy). Evaluation samples from the trained policy.

Atari preprocessing as in ``dqn_atari.py`` (``cleanrl_utils.atari_wrappers``). The replay buffer
is ``cleanrl_utils.buffers.AtariFrameBuffer``: each 84x84 frame is stored once and the 4-frame
stacks are rebuilt when sampling, about 7 KB per transition instead of 56 KB, so the default
million transitions need under 7 GiB.

Vectorized: ``--num-envs`` envs step in subprocess workers (``AsyncVectorEnv`` with shared memory,
gymnasium's default next-step autoreset). ``global_step`` counts the steps of all envs, and the step-based flags
(``--learning-starts``, ``--update-frequency``, ``--target-network-frequency``) are in global
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
import torch.nn.functional as F
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
    """episodes of evaluation after --save-model (actions sampled from the policy)"""

    # Algorithm specific arguments
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the Atari environment (`<Game>NoFrameskip-v4`, or `ALE/<Game>-v5` with its sticky actions)"""
    total_timesteps: int = 5000000
    """total timesteps of the experiment (summed over all envs)"""
    num_envs: int = 1
    """the number of parallel game environments (each in its own subprocess)"""
    buffer_size: int = 1000000
    """the replay memory buffer size (transitions; about 7 KB each)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: hard copy)"""
    target_network_frequency: int = 8000
    """the global steps between two updates of the target networks"""
    batch_size: int = 64
    """the batch size of sample from the replay memory"""
    learning_starts: int = 20000
    """global step to start learning (uniformly random actions before it)"""
    policy_lr: float = 3e-4
    """the learning rate of the policy network optimizer"""
    q_lr: float = 3e-4
    """the learning rate of the Q network optimizer (and of alpha's)"""
    update_frequency: int = 4
    """the global steps between two gradient steps (of the critics, the actor and alpha)"""
    alpha: float = 0.2
    """entropy regularization coefficient (the initial value with --autotune)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient"""
    target_entropy_scale: float = 0.89
    """the target entropy, as a fraction of the entropy of the uniform policy, log(num_actions)"""

    # to be filled in runtime
    num_iterations: int = 0
    """the number of vector steps (computed in runtime)"""


def fail(message: str) -> None:
    """Bad input: one line on stderr and exit status 2, before anything is written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def validate(args: Args) -> None:
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "update_frequency", "alpha")
    for name in (*positive, "target_network_frequency", "eval_episodes", "policy_lr", "q_lr"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.learning_starts < 0 or args.checkpoint_frequency < 0 or args.keep_checkpoints < 1:
        fail("--learning-starts and --checkpoint-frequency must be >= 0, --keep-checkpoints >= 1")
    if not 0.0 < args.tau <= 1.0 or not 0.0 < args.gamma <= 1.0:
        fail("--tau and --gamma must be in (0, 1]")
    if not 0.0 < args.target_entropy_scale < 1.0:
        fail("--target-entropy-scale must be in (0, 1): 1 would ask for the uniform policy")
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
        fail(f"{args.env_id} is not an Atari (ALE) environment; sac_atari.py needs one, e.g. BreakoutNoFrameskip-v4")


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


def layer_init(layer, bias_const=0.0):
    nn.init.kaiming_normal_(layer.weight)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def nature_cnn():
    """The Nature DQN encoder (Mnih et al. 2015): 4x84x84 frames to 512 features."""
    return nn.Sequential(
        layer_init(nn.Conv2d(4, 32, 8, stride=4)),
        nn.ReLU(),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)),
        nn.ReLU(),
        layer_init(nn.Conv2d(64, 64, 3, stride=1)),
        nn.ReLU(),
        nn.Flatten(),
        layer_init(nn.Linear(3136, 512)),
        nn.ReLU(),
    )


class SoftQNetwork(nn.Module):
    def __init__(self, envs):
        super().__init__()
        self.encoder = nature_cnn()
        self.fc_q = layer_init(nn.Linear(512, envs.single_action_space.n))

    def forward(self, x):
        return self.fc_q(self.encoder(x / 255.0))


class Actor(nn.Module):
    def __init__(self, envs):
        super().__init__()
        self.encoder = nature_cnn()
        self.fc_logits = layer_init(nn.Linear(512, envs.single_action_space.n))

    def forward(self, x):
        return self.fc_logits(self.encoder(x / 255.0))

    def get_action(self, x):
        """A sampled action, and the log-probabilities and probabilities of every action."""
        logits = self(x)
        dist = torch.distributions.Categorical(logits=logits)
        # log_softmax rather than log(probs): exact where a probability underflows to 0.
        return dist.sample(), F.log_softmax(logits, dim=1), dist.probs


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

    actor = Actor(envs).to(device)
    qf1 = SoftQNetwork(envs).to(device)
    qf2 = SoftQNetwork(envs).to(device)
    qf1_target = SoftQNetwork(envs).to(device)
    qf2_target = SoftQNetwork(envs).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    # Adam's eps raised from 1e-8 to 1e-4, as is usual for Atari: fewer huge steps on tiny gradients.
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.q_lr, eps=1e-4)
    actor_optimizer = optim.Adam(actor.parameters(), lr=args.policy_lr, eps=1e-4)
    networks = {"actor": actor, "qf1": qf1, "qf2": qf2, "qf1_target": qf1_target, "qf2_target": qf2_target}
    optimizers = {"q_optimizer": q_optimizer, "actor_optimizer": actor_optimizer}

    # Automatic entropy tuning towards a fraction of the uniform policy's entropy, log(num_actions).
    target_entropy = args.target_entropy_scale * float(np.log(envs.single_action_space.n))
    log_alpha = torch.full((1,), float(np.log(args.alpha)), device=device, requires_grad=True)
    a_optimizer = optim.Adam([log_alpha], lr=args.q_lr, eps=1e-4)
    if args.autotune:
        optimizers["a_optimizer"] = a_optimizer
    alpha = args.alpha

    rb = AtariFrameBuffer(args.buffer_size, args.num_envs, frame_shape=envs.single_observation_space.shape[1:])
    print(f"replay buffer: {rb.capacity} transitions, {rb.nbytes / 2**30:.2f} GiB", flush=True)

    if args.checkpoint_buffer:
        print(f"warning: --checkpoint-buffer adds up to {rb.nbytes / 2**30:.2f} GiB to every checkpoint", flush=True)
    global_step, start_iteration, num_updates = 0, 1, 0
    if resume_state is not None:
        for name, module in (*networks.items(), *optimizers.items()):
            module.load_state_dict(resume_state[name])
        with torch.no_grad():
            log_alpha.copy_(resume_state["log_alpha"])
        alpha = log_alpha.exp().item() if args.autotune else args.alpha
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
                "log_alpha": log_alpha.detach().cpu(),
                "rng": [rng_state()],
                **({"replay_buffer": rb.state_dict()} if args.checkpoint_buffer else {}),
            },
            run_dir,
            keep=args.keep_checkpoints,
        )

    stop = StopRequest().install()
    start_time, start_step = time.time(), global_step
    progress = Progress(args.total_timesteps, start_step=global_step)
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
                actions = actor.get_action(torch.as_tensor(obs, device=device))[0].cpu().numpy()

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
            for _ in range(global_step // args.update_frequency - previous_step // args.update_frequency):
                data = rb.sample(args.batch_size, rng, device)
                # CRITIC training
                with torch.no_grad():
                    _, next_log_pi, next_action_probs = actor.get_action(data.next_observations)
                    qf_next_target = torch.min(qf1_target(data.next_observations), qf2_target(data.next_observations))
                    # The exact expectation over the discrete next action, entropy bonus included.
                    min_qf_next_target = (next_action_probs * (qf_next_target - alpha * next_log_pi)).sum(dim=1)
                    next_q_value = data.rewards + (1 - data.terminations) * args.gamma * min_qf_next_target

                taken = data.actions.long().view(-1, 1)
                qf1_values = qf1(data.observations)
                qf2_values = qf2(data.observations)
                qf1_a_values = qf1_values.gather(1, taken).view(-1)
                qf2_a_values = qf2_values.gather(1, taken).view(-1)
                qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
                qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
                qf_loss = qf1_loss + qf2_loss
                if not torch.isfinite(qf_loss):
                    exit_non_finite(global_step, iteration, run_dir, script)
                q_optimizer.zero_grad()
                qf_loss.backward()
                q_optimizer.step()
                num_updates += 1

                # ACTOR training, against the critics' values before this step's update (no gradient to them)
                _, log_pi, action_probs = actor.get_action(data.observations)
                min_qf_values = torch.min(qf1_values, qf2_values).detach()
                actor_loss = (action_probs * (alpha * log_pi - min_qf_values)).sum(dim=1).mean()
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                if args.autotune:
                    # The policy's entropy is -sum_a p log p; alpha grows when it falls below the target.
                    entropy = -(action_probs.detach() * log_pi.detach()).sum(dim=1)
                    alpha_loss = (log_alpha.exp() * (entropy - target_entropy)).mean()
                    a_optimizer.zero_grad()
                    alpha_loss.backward()
                    a_optimizer.step()
                    alpha = log_alpha.exp().item()

                if num_updates % 10 == 0:
                    sps = int((global_step - start_step) / (time.time() - start_time))
                    writer.add_scalar("losses/qf1_values", qf1_a_values.mean().item(), global_step)
                    writer.add_scalar("losses/qf2_values", qf2_a_values.mean().item(), global_step)
                    writer.add_scalar("losses/qf1_loss", qf1_loss.item(), global_step)
                    writer.add_scalar("losses/qf2_loss", qf2_loss.item(), global_step)
                    writer.add_scalar("losses/qf_loss", qf_loss.item() / 2.0, global_step)
                    writer.add_scalar("losses/actor_loss", actor_loss.item(), global_step)
                    writer.add_scalar("losses/alpha", alpha, global_step)
                    if args.autotune:
                        writer.add_scalar("losses/alpha_loss", alpha_loss.item(), global_step)
                    writer.add_scalar("charts/SPS", sps, global_step)

            # update the target networks
            if global_step // args.target_network_frequency != previous_step // args.target_network_frequency:
                for net, target in ((qf1, qf1_target), (qf2, qf2_target)):
                    for param, target_param in zip(net.parameters(), target.parameters(), strict=True):
                        target_param.data.copy_(args.tau * param.data + (1.0 - args.tau) * target_param.data)

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
                "critic_state_dicts": {"qf1": qf1.state_dict(), "qf2": qf2.state_dict()},
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
