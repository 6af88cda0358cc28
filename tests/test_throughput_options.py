"""The throughput options of the Atari PPO scripts change speed, not what is computed (beyond bf16 rounding)."""

from __future__ import annotations

import copy
import types

import gymnasium as gym
import pytest
import torch

from conftest import check_ok, load_script_module, only_run_dir, read_scalars, run_script, train_two_ranks

SCRIPTS = ["ppo_atari.py", "ppo_atari_multigpu.py"]


def agents(script):
    module = load_script_module(script)
    torch.manual_seed(0)
    plain = module.Agent(types.SimpleNamespace(single_action_space=gym.spaces.Discrete(4)))
    fast = copy.deepcopy(plain).to(memory_format=torch.channels_last)
    fast.channels_last = True
    return plain, fast


def batch(n=16):
    gen = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8, generator=gen)
    return obs, torch.randint(0, 4, (n,), generator=gen)


@pytest.mark.parametrize("script", SCRIPTS)
def test_channels_last_computes_the_same_forward_and_gradients(script):
    plain, fast = agents(script)
    obs, actions = batch()
    outputs = []
    for agent in (plain, fast):
        _, logprob, entropy, value = agent.get_action_and_value(obs, actions)
        (logprob.sum() + entropy.sum() + value.sum()).backward()
        outputs.append((logprob, entropy, value, [p.grad.contiguous() for p in agent.parameters()]))
    for a, b in zip(outputs[0][:3], outputs[1][:3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(outputs[0][3], outputs[1][3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    assert fast.network[0].weight.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("script", SCRIPTS)
def test_bf16_autocast_keeps_fp32_outputs_close_to_fp32(script):
    plain, fast = agents(script)
    obs, actions = batch()
    _, logprob, entropy, value = plain.get_action_and_value(obs, actions)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, logprob16, entropy16, value16 = fast.get_action_and_value(obs, actions)
    assert logprob16.dtype == entropy16.dtype == value16.dtype == torch.float32
    torch.testing.assert_close(logprob16, logprob, rtol=0, atol=2e-2)
    torch.testing.assert_close(value16, value, rtol=0, atol=5e-2)


def test_env_groups_and_bf16_under_torchrun_keep_ranks_identical(workdir):
    flags = ["--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2",
             "--total-timesteps", "384", "--env-groups", "2", "--bf16"]  # fmt: skip
    done = train_two_ranks(flags, workdir)
    assert {d["updates"] for d in done.values()} == {3 * 2 * 2}  # 3 iterations x 2 epochs x 2 minibatches


def loss_inputs(n=16):
    gen = torch.Generator().manual_seed(2)
    obs, actions = batch(n)
    old_logprobs = torch.full((n,), -1.4) + 0.1 * torch.randn(n, generator=gen)
    advantages, returns, old_values = (torch.randn(n, generator=gen) for _ in range(3))
    return obs, actions, old_logprobs, advantages, returns, old_values


def test_compiled_loss_gives_the_same_loss_and_gradients():
    module = load_script_module("ppo_atari.py")
    args = module.Args()
    eager_agent, _ = agents("ppo_atari.py")
    compiled_agent = copy.deepcopy(eager_agent)
    results = []
    for agent, fn in ((eager_agent, module.ppo_loss), (compiled_agent, torch.compile(module.ppo_loss))):
        loss, pg_loss, v_loss, entropy_loss, _, ratio = fn(agent, args, *loss_inputs())
        loss.backward()
        results.append(([loss, pg_loss, v_loss, entropy_loss, ratio], [p.grad for p in agent.parameters()]))
    for a, b in zip(results[0][0], results[1][0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_compile_flag_trains_under_torchrun_with_identical_ranks(workdir):
    flags = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
             "--total-timesteps", "128", "--compile", "--env-backend", "ale", "--no-cuda"]  # fmt: skip
    done = train_two_ranks(flags, workdir)
    assert {d["updates"] for d in done.values()} == {2 * 1 * 2}  # 2 iterations x 1 epoch x 2 minibatches


@pytest.mark.parametrize("script", SCRIPTS)
def test_bf16_acting_copy_gives_exactly_the_autocast_outputs(script):
    # The rollout under --bf16 acts with a bf16 copy of the weights instead of autocast casting them per step.
    _, agent = agents(script)
    acting = copy.deepcopy(agent).to(torch.bfloat16)
    obs, actions = batch(4)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = agent.get_action_and_value(obs, actions), acting.get_action_and_value(obs, actions)
        for a, b in zip(*outputs, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert torch.equal(agent.get_value(obs), acting.get_value(obs))
    assert acting.network[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_fused_adam_takes_the_steps_of_the_unfused_loop():
    # The Atari PPO scripts use Adam(fused=True): the same update rule, up to the rounding of its kernel.
    plain, _ = agents("ppo_atari.py")
    fused = copy.deepcopy(plain)
    optimizers = [torch.optim.Adam(plain.parameters(), lr=2.5e-4, eps=1e-5),
                  torch.optim.Adam(fused.parameters(), lr=2.5e-4, eps=1e-5, fused=True)]  # fmt: skip
    obs, actions = batch(8)
    for _ in range(20):
        for agent, optimizer in zip((plain, fused), optimizers, strict=True):
            _, logprob, entropy, value = agent.get_action_and_value(obs, actions)
            optimizer.zero_grad()
            (logprob.mean() + 0.01 * entropy.mean() + value.pow(2).mean()).backward()
            optimizer.step()
    for a, b in zip(plain.parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    start = agents("ppo_atari.py")[0].parameters()
    assert any(not torch.equal(a, b) for a, b in zip(plain.parameters(), start, strict=True))  # it did move


@pytest.mark.parametrize("script", SCRIPTS)
def test_bf16_rollout_acts_with_the_weights_being_updated(script, workdir):
    # One epoch of one minibatch: the update's first forward pass sees the weights the rollout acted
    # with, so the stored log-probabilities must be recomputed exactly (old_approx_kl 0) at every
    # iteration. An acting copy left stale after the first update gives a KL of about 7 here.
    flags = ["--bf16", "--env-backend", "ale", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "1",
             "--update-epochs", "1", "--learning-rate", "0.01", "--no-anneal-lr", "--total-timesteps", "640",
             "--no-cuda", "--checkpoint-frequency", "0"]  # fmt: skip
    proc = run_script(script, flags, workdir)
    check_ok(proc)
    kls = [v for _, v in read_scalars(only_run_dir(workdir))["losses/old_approx_kl"]]
    assert len(kls) == 5 and max(abs(kl) for kl in kls) < 1e-4, kls


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("layout", ["plain", "channels_last"])
def test_stored_frames_are_exactly_the_input_the_network_computed_from_uint8(script, layout):
    # The rollout stores preprocess(frames) (in bf16 with --bf16) and the update reads it back: the
    # values, the layout and every output must be those of the network fed the uint8 frames.
    module = load_script_module(script)
    agent = agents(script)[layout == "channels_last"]
    obs, actions = batch(8)
    x = agent.preprocess(obs)
    assert x.dtype == torch.float32 and torch.equal(x, obs / 255.0)
    assert x.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
    for dtype, bf16 in ((torch.float32, False), (torch.bfloat16, True)):
        storage = module.frame_storage((2, 4), (4, 84, 84), dtype, layout == "channels_last", "cpu")
        storage[0], storage[1] = x[:4], x[4:]  # two rollout steps of 4 envs
        flat = storage.reshape(-1, 4, 84, 84)
        assert flat.data_ptr() == storage.data_ptr()  # flattening the batch is a view, not a copy
        if layout == "channels_last":
            assert storage[0].is_contiguous(memory_format=torch.channels_last)
            assert flat[torch.tensor([5, 0, 3])].is_contiguous(memory_format=torch.channels_last)  # a minibatch
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            from_frames = agent.get_action_and_value(obs, actions)
            from_storage = agent.get_action_and_value(flat, actions)
        for a, b in zip(from_frames, from_storage, strict=True):
            assert torch.equal(a, b)
