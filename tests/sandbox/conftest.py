"""Tiny Harbor tasks and a trial runner for the local sandbox's tests.

``make_task(tmp_path, name, solve=..., test=..., app=...)`` writes a Harbor-format task (task.toml,
instruction.md, environment/{Dockerfile,app/}, tests/test.sh, solution/solve.sh). ``run_trial(task, agent)``
runs one real Harbor trial of it in ``LocalEnvironment`` and returns Harbor's ``TrialResult``; ``agent`` is a
Harbor agent name (``oracle``, ``nop``) or an import path.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from harness_grpo.harbor_local import check_prerequisites

os.environ["HARBOR_TELEMETRY"] = "0"

LOCAL_ENV = "harness_grpo.harbor_local:LocalEnvironment"

TEST_WRITES_REWARD = """\
#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then reward=1; fi
echo "$reward" > /logs/verifier/reward.txt
"""


def make_task(
    parent: Path,
    name: str,
    *,
    solve: str = "#!/bin/bash\necho 42 > /app/answer.txt\n",
    test: str = TEST_WRITES_REWARD,
    app: dict[str, str] | None = None,
    agent_timeout_s: float = 30.0,
) -> Path:
    """A Harbor task directory ``parent/name``; its verifier rewards ``/app/answer.txt == 42`` by default."""
    task = parent / name
    (task / "environment" / "app").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text(
        textwrap.dedent(
            f"""\
            schema_version = "1.4"

            [agent]
            timeout_sec = {agent_timeout_s}

            [verifier]
            timeout_sec = 30.0

            [environment]
            workdir = "/app"
            build_timeout_sec = 60.0
            """
        )
    )
    (task / "instruction.md").write_text("Write 42 into /app/answer.txt.\n")
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\nCOPY app/ /app/\n")
    for relative, content in (app or {}).items():
        (task / "environment" / "app" / relative).write_text(content)
    (task / "tests" / "test.sh").write_text(test)
    (task / "solution" / "solve.sh").write_text(solve)
    return task


async def run_trial(task: Path, agent: str, trials_dir: Path, *, allow_ports: tuple[int, ...] = (), **agent_kwargs):
    """One real Harbor trial of ``task`` with ``agent`` (a name or an import path) in ``LocalEnvironment``."""
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    agent_config = AgentConfig(import_path=agent, kwargs=agent_kwargs) if ":" in agent else AgentConfig(name=agent)
    config = TrialConfig(
        task=TaskConfig(path=task),
        trials_dir=trials_dir,
        agent=agent_config,
        environment=EnvironmentConfig(import_path=LOCAL_ENV, kwargs={"allow_ports": list(allow_ports)}),
    )
    trial = await Trial.create(config)
    return await trial.run()


@pytest.fixture(autouse=True)
def _local_sandbox_available() -> None:
    check_prerequisites()
