"""``launchers/hf_jobs.py``: the job specification (``--dry-run``), its submission through the real
``huggingface_hub`` client to ``FakeJobsAPI`` (a stand-in for the paid Jobs API), the refusals that send nothing,
and the job's own command run here on CPU (the embedded engine in place of vLLM, the checkout in place of a clone).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from examples import submit_task
from harness_grpo.checkpoints import TRAINER_STATE
from harness_grpo.hf_jobs import job_spec
from tests.launchers.fake_jobs_api import JOB_ID, USER, FakeJobsAPI
from tests.support.processes import REPO_ROOT, repo_env

LAUNCHER = REPO_ROOT / "launchers" / "hf_jobs.py"
SOURCE = ["--source", "https://github.com/example/harness-grpo", "--revision", "0a1b2c3d"]
TRAIN = ["--model", "Qwen/Qwen3-0.6B", "--harness", "opencode", "--sandbox", "e2b", "--max_steps", "100"]
HF_TOKEN, E2B_KEY = "hf_secret_token_value", "e2b_secret_key_value"


def _launch(*argv: str, endpoint: str = "http://127.0.0.1:9", **env: str) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in repo_env().items() if key not in ("HF_TOKEN", "E2B_API_KEY")}
    environ.update(HF_ENDPOINT=endpoint, **env)
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *argv], env=environ, capture_output=True, text=True, timeout=120, check=False
    )


def _script(command: list[str]) -> list[str]:
    assert command[:2] == ["bash", "-c"]
    return command[2].splitlines()


def test_dry_run_prints_the_job_specification_and_no_secret(tmp_path: Path) -> None:
    argv = ["--dry-run", "--flavor", "h200x4", "--timeout", "3h", *SOURCE, "--hub_model_id", "me/agent-run"]
    argv += ["-v", "hf://buckets/me/runs:/runs", "-e", "WANDB_MODE=offline", "--", *TRAIN]
    done = _launch(*argv, HF_HOME=str(tmp_path), HF_TOKEN=HF_TOKEN, E2B_API_KEY=E2B_KEY)
    assert done.returncode == 0, done.stderr
    assert HF_TOKEN not in done.stdout + done.stderr and E2B_KEY not in done.stdout + done.stderr
    spec = json.loads(done.stdout)
    assert spec["flavor"] == "h200x4" and spec["timeout"] == "3h" and spec["name"] == "harness-grpo"
    assert spec["image"] == "ghcr.io/astral-sh/uv:python3.12-bookworm"
    assert spec["secrets"] == ["HF_TOKEN", "E2B_API_KEY"]  # the e2b sandbox's key added by name
    assert spec["env"] == {"PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    assert spec["volumes"] == ["hf://buckets/me/runs:/runs"] and spec["namespace"] is None
    lines = _script(spec["command"])
    assert lines[0] == "set -euo pipefail"
    assert lines[1] == (
        "git clone --quiet https://github.com/example/harness-grpo /harness-grpo && cd /harness-grpo "
        "&& git checkout --quiet 0a1b2c3d"
    )
    assert "uv pip install --override /tmp/overrides.txt -e '.[vllm,e2b]'" in lines[2]
    entry = shlex.split(lines[3])
    assert entry[:3] == ["exec", "python", "launchers/job_entry.py"]
    assert entry[3:9] == ["--engine", "vllm", "--engine_gpus", "0", "--trainer_gpus", "1,2,3"]
    assert entry[entry.index("--") + 1 :] == [*TRAIN, "--push_to_hub", "true", "--hub_model_id", "me/agent-run"]


def test_submission_sends_the_specified_job_to_the_jobs_api(tmp_path: Path) -> None:
    argv = ["--flavor", "h200x2", "--timeout", "2h", *SOURCE, "-v", "hf://buckets/me/runs/sub:/runs:ro", "--", *TRAIN]
    env = {"HF_HOME": str(tmp_path), "HF_TOKEN": HF_TOKEN, "E2B_API_KEY": E2B_KEY}
    dry = json.loads(_launch("--dry-run", *argv, **env).stdout)
    with FakeJobsAPI() as api:
        done = _launch(*argv, endpoint=api.url, **env)
    assert done.returncode == 0, done.stderr
    assert f"job {JOB_ID} submitted: {api.url}/jobs/{USER}/{JOB_ID}" in done.stdout
    assert HF_TOKEN not in done.stdout + done.stderr and E2B_KEY not in done.stdout + done.stderr
    [post] = api.submissions()
    assert post.path == f"/api/jobs/{USER}"  # the token's user, from whoami, is the default namespace
    assert post.headers["authorization"] == f"Bearer {HF_TOKEN}"
    assert post.body == {
        "dockerImage": dry["image"],
        "command": dry["command"],
        "arguments": [],
        "environment": dry["env"],
        "secrets": {"HF_TOKEN": HF_TOKEN, "E2B_API_KEY": E2B_KEY},  # values only in the request itself
        "flavor": "h200x2",
        "timeoutSeconds": 7200,
        "labels": {"name": "harness-grpo"},
        "volumes": [{"type": "bucket", "source": "me/runs", "mountPath": "/runs", "readOnly": True, "path": "sub"}],
    }


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([*SOURCE, "--", *TRAIN], {"HF_TOKEN": HF_TOKEN}, "no value for the secret(s) E2B_API_KEY"),
        ([*SOURCE, "--flavor", "a100-large", "--", *TRAIN], {}, "flavor a100-large has 1 GPU(s)"),
        ([*SOURCE, "--", "--harness", "opencode"], {}, "must name the policy: -- --model"),
        ([*SOURCE, "-v", "/data:/data", "--", *TRAIN], {}, "--volume '/data:/data'"),
    ],
)
def test_refusals_say_what_to_change_and_send_nothing(
    tmp_path: Path, argv: list[str], env: dict[str, str], message: str
) -> None:
    with FakeJobsAPI() as api:
        done = _launch(*argv, endpoint=api.url, HF_HOME=str(tmp_path), **env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("cannot submit: ") and message in done.stderr, done.stderr
    assert api.submissions() == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(600)
def test_the_job_command_runs_here_on_cpu(tmp_path: Path) -> None:
    """The job's own script (checkout already here, nothing to install, ``cpu-basic``: the embedded engine) trains one
    step after the template warm-up, and leaves no child behind."""
    out, logs = tmp_path / "run", tmp_path / "job-logs"
    train = ["--model", str(submit_task.task_model_path()), "--output_dir", str(out), "--max_steps", "1"]
    train += ["--num_generations", "2", "--groups_per_step", "1", "--max_concurrent_rollouts", "2", "--save_steps", "1"]
    train += ["--sandbox", "local", "--disable_tqdm", "true"]
    entry = ["--engine_port", str(_free_port()), "--log_dir", str(logs), "--warm_templates", "yes"]
    spec = job_spec(train, flavor="cpu-basic", source=str(REPO_ROOT), install="", entry_flags=entry)
    assert _script(spec.command)[1] == f"cd {shlex.quote(str(REPO_ROOT))}"
    env = repo_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **spec.env)
    done = subprocess.run(spec.command, env=env, capture_output=True, text=True, timeout=540, check=False)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-4000:] + (logs / "trainer.log").read_text()[-4000:]
    order = [text.index(line) for line in ("engine healthy", "sandbox templates ready", "started trainer")]
    assert order == sorted(order), text
    assert "trainer exited with 0" in text
    assert "templates ready" in (logs / "warmup.log").read_text()
    assert json.loads((out / "checkpoint-1" / TRAINER_STATE).read_text())["global_step"] == 1
    groups = [int(pgid) for pgid in re.findall(r"started \w+ \(pid (\d+)", text)]
    assert len(groups) == 3  # engine, warm-up, trainer
    for pgid in groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
