"""cleanrl_utils/submit_exp.py against a moto AWS Batch server started on 127.0.0.1 by these tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

from conftest import REPO, free_port

SECRET = "wandb-secret-5f1e0c9a7d3b"
RETRY = {
    "attempts": 3,
    "evaluateOnExit": [
        {"onStatusReason": "Host EC2*", "action": "RETRY"},
        {"onExitCode": "75", "action": "RETRY"},
        {"onReason": "*", "action": "EXIT"},
    ],
}


def aws_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "WANDB_API_KEY": SECRET,
        }
    )
    env.update(extra)
    return env


def start_moto(**extra_env: str):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=aws_env(**extra_env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.2)


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def post(url: str, body: dict | None = None) -> None:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()


def client(url: str, service: str = "batch"):
    return boto3.client(
        service,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def prepare(url: str, queues=("c5-12xlarge", "test-queue")) -> None:
    """A fresh server state: one compute environment and its job queues; jobs succeed at once."""
    post(f"{url}/moto-api/reset")
    post(f"{url}/moto-api/config", {"batch": {"use_docker": False}})
    role = client(url, "iam").create_role(RoleName="batch-service", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    batch = client(url)
    ce = batch.create_compute_environment(
        computeEnvironmentName="cleanrl-ce", type="UNMANAGED", state="ENABLED", serviceRole=role
    )
    for name in queues:
        batch.create_job_queue(
            jobQueueName=name,
            state="ENABLED",
            priority=1,
            computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}],
        )


@pytest.fixture(scope="module")
def moto_url():
    proc, url = start_moto()
    yield url
    stop(proc)


@pytest.fixture
def batch_url(moto_url):
    prepare(moto_url)
    return moto_url


@pytest.fixture
def workdir(checkout_workdir: Path) -> Path:
    # The submitter checks the script exists relative to where it runs (the repository root for users).
    return checkout_workdir


def submit(args: list[str], cwd: Path, by_path: bool = False, timeout: float = 120):
    entry = [str(REPO / "cleanrl_utils" / "submit_exp.py")] if by_path else ["-m", "cleanrl_utils.submit_exp"]
    return subprocess.run(
        [sys.executable, *entry, *args], cwd=cwd, env=aws_env(), capture_output=True, text=True, timeout=timeout
    )


def manifests(cwd: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cwd / "submissions").glob("*.json"))]


def assert_no_secret(proc, cwd: Path) -> None:
    assert SECRET not in proc.stdout and SECRET not in proc.stderr
    for path in cwd.rglob("*.json"):
        assert SECRET not in path.read_text(), path


def all_jobs(url: str) -> list[dict]:
    batch = client(url)
    ids = []
    for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"):
        ids += [j["jobId"] for j in batch.list_jobs(jobQueue="c5-12xlarge", jobStatus=status)["jobSummaryList"]]
        ids += [j["jobId"] for j in batch.list_jobs(jobQueue="test-queue", jobStatus=status)["jobSummaryList"]]
    return batch.describe_jobs(jobs=ids)["jobs"] if ids else []


def test_jobs_per_env_and_seed_share_one_definition_and_wait_reports_success(batch_url, workdir):
    flags = ["--command", "python cleanrl/ppo.py --total-timesteps 5000", "--env-ids", "CartPole-v1", "Acrobot-v1"]
    flags += ["--num-seeds", "2", "--start-seed", "7", "--job-queue", "test-queue", "--num-vcpu", "2"]
    flags += ["--num-memory", "3000", "--aws-num-retries", "2", "--endpoint-url", batch_url]
    proc = submit([*flags, "--wait", "--poll-seconds", "0.2"], workdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all jobs succeeded" in proc.stdout and "SUCCEEDED=4" in proc.stdout
    assert_no_secret(proc, workdir)

    jobs = {j["jobName"]: j for j in all_jobs(batch_url)}
    assert sorted(jobs) == sorted(f"ppo-{e}-{s}" for e in ("CartPole-v1", "Acrobot-v1") for s in (7, 8))
    job = jobs["ppo-Acrobot-v1-8"]
    assert job["status"] == "SUCCEEDED"
    command = ["--", "cleanrl/ppo.py", "--total-timesteps", "5000", "--env-id", "Acrobot-v1", "--seed", "8"]
    assert job["container"]["command"] == command
    # The secret does reach the job, from the submitter's environment.
    assert {"name": "WANDB_API_KEY", "value": SECRET} in job["container"]["environment"]
    assert job["timeout"] == {"attemptDurationSeconds": 24 * 3600}

    definitions = client(batch_url).describe_job_definitions(status="ACTIVE")["jobDefinitions"]
    assert len(definitions) == 1
    props = definitions[0]["containerProperties"]
    assert props["image"] == "cleanrl-torchrun:latest"
    assert {"type": "VCPU", "value": "2"} in props["resourceRequirements"]
    assert {"type": "MEMORY", "value": "3000"} in props["resourceRequirements"]
    assert {job["jobDefinition"] for job in jobs.values()} == {definitions[0]["jobDefinitionArn"]}

    [manifest] = manifests(workdir)
    assert [j["command"] for j in manifest["jobs"] if j["name"] == "ppo-Acrobot-v1-8"] == [command]
    assert {j["job_id"] for j in manifest["jobs"]} == {j["jobId"] for j in jobs.values()}
    assert {j["status"] for j in manifest["jobs"]} == {"SUCCEEDED"}
    assert manifest["environment_names"] == ["WANDB_API_KEY"]

    # A second submission of the same shape reuses the definition; another shape gets its own.
    again = submit([*flags, "--env-ids", "Pendulum-v1", "--num-seeds", "1"], workdir)
    assert again.returncode == 0 and "(reused)" in again.stdout, again.stdout + again.stderr
    assert len(client(batch_url).describe_job_definitions(status="ACTIVE")["jobDefinitions"]) == 1
    other = submit([*flags, "--num-vcpu", "4"], workdir)
    assert other.returncode == 0, other.stderr
    assert len(client(batch_url).describe_job_definitions(status="ACTIVE")["jobDefinitions"]) == 2


def test_array_and_multi_node_requests(batch_url, workdir, monkeypatch, capsys):
    """In process, recording what goes over the wire (moto does not echo node overrides back)."""
    from cleanrl_utils import submit_exp

    sent: list[tuple[str, dict]] = []

    def recording_client(args):
        c = client(batch_url)
        for op in ("SubmitJob", "RegisterJobDefinition"):
            c.meta.events.register(
                f"provide-client-params.batch.{op}", lambda params, _op=op, **kw: sent.append((_op, dict(params)))
            )
        return c

    monkeypatch.setattr(submit_exp, "make_client", recording_client)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.chdir(workdir)
    common = ["--endpoint-url", batch_url, "--aws-num-retries", "2", "--num-hours", "1.5"]

    assert submit_exp.main(["--env-id", "PongNoFrameskip-v4", "--num-seeds", "3", "--array", "--job-queue", "test-queue", *common]) == 0  # fmt: skip
    assert submit_exp.main(["--env-id", "BreakoutNoFrameskip-v4", "--num-nodes", "2", "--start-seed", "4",
                            "--command", "cleanrl/ppo_atari_multigpu.py --local-num-envs 8", "--instance-type", "c5.12xlarge", *common]) == 0  # fmt: skip
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err

    [array_def, array_job, mnp_def, mnp_job] = sent
    assert array_def[0] == "RegisterJobDefinition" and array_def[1]["type"] == "container"
    array = array_job[1]
    assert array["arrayProperties"] == {"size": 3}
    assert array["containerOverrides"]["command"] == [
        "--array-seed", "1", "--", "cleanrl/ppo_atari_multigpu.py", "--env-id", "PongNoFrameskip-v4",
    ]  # fmt: skip
    assert array["containerOverrides"]["environment"] == [{"name": "WANDB_API_KEY", "value": SECRET}]
    assert array["retryStrategy"] == RETRY and array["timeout"] == {"attemptDurationSeconds": 5400}

    nodes = mnp_def[1]["nodeProperties"]
    assert mnp_def[1]["type"] == "multinode" and nodes["numNodes"] == 2 and nodes["mainNode"] == 0
    resources = nodes["nodeRangeProperties"][0]["container"]["resourceRequirements"]
    assert {"type": "VCPU", "value": "48"} in resources  # c5.12xlarge's defaults
    assert {"type": "MEMORY", "value": str(int(96 * 1024 * 0.9))} in resources
    [override] = mnp_job[1]["nodeOverrides"]["nodePropertyOverrides"]
    assert override["targetNodes"] == "0:"
    assert override["containerOverrides"]["command"] == [
        "--", "cleanrl/ppo_atari_multigpu.py", "--local-num-envs", "8",
        "--env-id", "BreakoutNoFrameskip-v4", "--seed", "4",
    ]  # fmt: skip
    assert override["containerOverrides"]["environment"] == [{"name": "WANDB_API_KEY", "value": SECRET}]
    assert mnp_job[1]["jobQueue"] == "c5-12xlarge" and mnp_job[1]["retryStrategy"] == RETRY

    described = {j["jobName"]: j for j in all_jobs(batch_url)}
    assert described["ppo_atari_multigpu-PongNoFrameskip-v4-seeds1to3"]["arrayProperties"]["size"] == 3
    assert described["ppo_atari_multigpu-BreakoutNoFrameskip-v4-4"]["nodeProperties"]["numNodes"] == 2
    for path in workdir.rglob("*.json"):
        assert SECRET not in path.read_text()


def test_the_article_command_by_path(batch_url, workdir):
    flags = ["--env-id", "BreakoutNoFrameskip-v4", "--num-seeds", "3", "--num-nodes", "4"]
    proc = submit([*flags, "--instance-type", "c5.12xlarge", "--endpoint-url", batch_url], workdir, by_path=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = all_jobs(batch_url)
    assert len(jobs) == 3 and all(j["nodeProperties"]["numNodes"] == 4 for j in jobs)
    [definition] = client(batch_url).describe_job_definitions(status="ACTIVE")["jobDefinitions"]
    assert definition["type"] == "multinode"
    [manifest] = manifests(workdir)
    assert [j["command"][1] for j in manifest["jobs"]] == ["cleanrl/ppo_atari_multigpu.py"] * 3
    assert [j["seeds"] for j in manifest["jobs"]] == [[1], [2], [3]]

    # --spot picks the -spot queue, which this account lacks: a clear error, nothing registered.
    spot = submit([*flags, "--instance-type", "c5.12xlarge", "--spot", "--endpoint-url", batch_url], workdir)
    assert spot.returncode == 2 and spot.stderr.strip() == (
        "error: job queue c5-12xlarge-spot does not exist in this region; create it or pass --job-queue"
    )
    assert len(all_jobs(batch_url)) == 3


def test_failing_jobs_make_wait_exit_non_zero(workdir):
    proc, url = start_moto(MOTO_SIMPLE_BATCH_FAIL_AFTER="0")
    try:
        prepare(url)
        args = ["--env-ids", "CartPole-v1", "--num-seeds", "2", "--command", "cleanrl/ppo.py", "--job-queue"]
        run = submit([*args, "test-queue", "--endpoint-url", url, "--wait", "--poll-seconds", "0.2"], workdir)
    finally:
        stop(proc)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAILED=2" in run.stdout and "some jobs did not succeed" in run.stdout
    assert {j["status"] for j in manifests(workdir)[0]["jobs"]} == {"FAILED"}
    assert_no_secret(run, workdir)


def test_dry_run_calls_nothing(batch_url, workdir):
    flags = ["--env-ids", "CartPole-v1", "Acrobot-v1", "--num-seeds", "2", "--command", "cleanrl/ppo.py"]
    proc = submit([*flags, "--job-queue", "test-queue", "--endpoint-url", batch_url, "--dry-run"], workdir)
    assert proc.returncode == 0, proc.stderr
    requests = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(requests) == 4
    assert requests[0]["containerOverrides"]["command"][-4:] == ["--env-id", "CartPole-v1", "--seed", "1"]
    assert requests[0]["containerOverrides"]["environment"] == [{"name": "WANDB_API_KEY", "value": "********"}]
    assert_no_secret(proc, workdir)
    assert all_jobs(batch_url) == []
    assert client(batch_url).describe_job_definitions()["jobDefinitions"] == []
    assert not (workdir / "submissions").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "CartPole-v1", "--instance-type", "c9.huge"], "unknown --instance-type c9.huge; known: c5.large"),
        (["--job-queue", "test-queue"], "no env ids"),
        (["--env-id", "CartPole-v1", "--job-queue", "test-queue", "--num-nodes", "0"], "--num-nodes must be >= 1"),
        (["--env-id", "A-v1", "--env-ids", "B-v1", "--job-queue", "test-queue"], "give --env-id or --env-ids, not both"),
        (["--env-id", "A-v1", "--job-queue", "q", "--command", "python cleanrl/nope.py"], "the script cleanrl/nope.py does not exist"),
        (["--env-id", "A-v1", "--job-queue", "q", "--command", "python --foo"], "--command must start with a script"),
        (["--env-id", "A-v1", "--job-queue", "q", "--command", "cleanrl/ppo.py --seed 3"], "must not contain --seed"),
        (["--env-id", "A-v1", "--job-queue", "q", "--array", "--num-seeds", "2", "--num-nodes", "2"], "--array cannot"),
        (["--env-id", "A-v1"], "give --job-queue or --instance-type"),
        (["--env-id", "A-v1", "--job-queue", "q", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)  # fmt: skip
def test_bad_input_is_one_error_line_and_no_aws_call(args, message, workdir):
    # A closed port: any AWS call would fail differently (and slowly).
    proc = submit([*args, "--endpoint-url", f"http://127.0.0.1:{free_port()}"], workdir, timeout=30)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert proc.stdout == ""
    assert not (workdir / "submissions").exists()


def test_preempted_status_matches_the_checkpoint_contract():
    from cleanrl_utils import checkpoint, submit_exp

    assert submit_exp.EXIT_PREEMPTED == checkpoint.EXIT_PREEMPTED
