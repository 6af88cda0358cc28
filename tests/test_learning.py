"""Learning test: ppo.py solves CartPole-v1 within the step budget (asserts steps and returns, not time)."""

from __future__ import annotations

from conftest import check_ok, only_run_dir, read_scalars, run_script

# Flags chosen for the test (they resemble the rl-baselines3-zoo CartPole settings); the script's
# defaults stay the classic CleanRL ones.
FLAGS = [
    "--total-timesteps",
    "100000",
    "--num-envs",
    "8",
    "--num-steps",
    "32",
    "--num-minibatches",
    "1",
    "--update-epochs",
    "20",
    "--learning-rate",
    "1e-3",
    "--gamma",
    "0.98",
    "--gae-lambda",
    "0.8",
    "--ent-coef",
    "0.0",
    "--seed",
    "1",
]


def first_step_reaching(returns: list[tuple[int, float]], threshold: float, window: int) -> int | None:
    for i in range(window - 1, len(returns)):
        if sum(v for _, v in returns[i - window + 1 : i + 1]) / window >= threshold:
            return returns[i][0]
    return None


def test_ppo_solves_cartpole_within_200k_steps(workdir):
    proc = run_script("ppo.py", FLAGS, workdir, timeout=900)
    check_ok(proc)
    returns = read_scalars(only_run_dir(workdir))["charts/episodic_return"]
    step = first_step_reaching(returns, 475.0, window=20)
    assert step is not None, f"mean of the last 20 returns never reached 475; final ones: {returns[-20:]}"
    assert step <= 200_000
