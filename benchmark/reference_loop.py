"""The throughput issue's reference: a straightforward fp32 PPO loop with in-process envs.

    python benchmark/reference_loop.py --iterations 6

The loop in the shape of the original CleanRL ppo_atari.py, with nothing tuned for speed: 8 Breakout
envs stepped one after another in the main process (SyncVectorEnv), the network in fp32 and the
default NCHW layout, frames kept as uint8 and scaled in every minibatch, acting under torch.no_grad,
Adam's default implementation, torch's default thread count (all cores), 128 steps per rollout and 4
epochs of 4 minibatches. It builds on cleanrl/ppo_atari.py's make_env, Agent, compute_gae and
ppo_loss, so it computes what the script computes. A truncated game is not bootstrapped (as in the
original). The last line printed is the steady-state SPS: the steps between the end of the first
iteration and the end of the last, over the time between them. benchmark/goal_ratio.py runs it side
by side with the scripts.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from throughput import ENV_ID, load_script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6, help="iterations of 1024 env steps (at least 2)")
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args()
    if opts.iterations < 2:
        raise SystemExit("error: --iterations must be at least 2 (the first one is left out of the SPS)")
    script = load_script("ppo_atari")
    args = script.Args(env_id=ENV_ID)  # the defaults: fp32, 8 envs, 128 steps, 4 minibatches, 4 epochs
    num_envs, num_steps = args.num_envs, args.num_steps
    batch_size = num_envs * num_steps
    minibatch_size = batch_size // args.num_minibatches
    torch.manual_seed(opts.seed)
    np.random.seed(opts.seed)

    envs = SyncVectorEnv(
        [script.make_env(ENV_ID, i, False, "reference") for i in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    agent = script.Agent(envs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((num_steps, num_envs) + envs.single_observation_space.shape, dtype=torch.uint8)
    actions = torch.zeros((num_steps, num_envs), dtype=torch.long)
    logprobs, rewards, dones, values = (torch.zeros((num_steps, num_envs)) for _ in range(4))
    no_bootstrap = torch.zeros((num_steps, num_envs))
    next_obs = torch.as_tensor(envs.reset(seed=opts.seed)[0])

    marks = []  # (env steps, time) at the end of each iteration
    for iteration in range(opts.iterations):
        for step in range(num_steps):
            obs[step] = next_obs
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            actions[step], logprobs[step], values[step] = action, logprob, value.flatten()
            next_obs_np, reward, terminated, truncated, _ = envs.step(action.numpy())
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
            dones[step] = torch.as_tensor(terminated | truncated, dtype=torch.float32)
            next_obs = torch.as_tensor(next_obs_np)
        with torch.no_grad():
            next_value = agent.get_value(next_obs).flatten()
            advantages, returns = script.compute_gae(
                rewards, values, dones, no_bootstrap, no_bootstrap, next_value, args.gamma, args.gae_lambda
            )
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_actions, b_logprobs = actions.reshape(-1), logprobs.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(batch_size)
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, batch_size, minibatch_size):
                mb = b_inds[start : start + minibatch_size]
                loss = script.ppo_loss(
                    agent, args, b_obs[mb], b_actions[mb], b_logprobs[mb], b_advantages[mb], b_returns[mb], b_values[mb]
                )[0]
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        marks.append((batch_size * (iteration + 1), time.perf_counter()))
        print(f"iteration {iteration + 1}: {marks[-1][0]} env steps", flush=True)
    envs.close()
    (first_steps, first_time), (last_steps, last_time) = marks[0], marks[-1]
    print(f"SPS {(last_steps - first_steps) / (last_time - first_time):.1f}")


if __name__ == "__main__":
    main()
