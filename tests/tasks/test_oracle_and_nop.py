"""Every example task through real Harbor trials in the local sandbox: Harbor's oracle agent (the task's
solution/solve.sh) scores 1, the nop agent (does nothing) scores 0; a half solution earns half the reward; agent
code that prints a fake reward earns nothing."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASK_DIRS = sorted(path for path in EXAMPLES.iterdir() if (path / "task.toml").is_file())
LOCAL_SANDBOX = EnvironmentConfig(import_path="harness_grpo.harbor_local:LocalEnvironment", kwargs={"allow_ports": []})
CONCURRENCY = 4


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")


async def _rewards(task_dir: Path, agent: str, trials_dir: Path, limit: asyncio.Semaphore) -> dict[str, float] | str:
    """The verifier's rewards of one Harbor trial of ``agent`` on ``task_dir``, or why there are none."""
    config = TrialConfig(
        task=TaskConfig(path=task_dir),
        trials_dir=trials_dir,
        trial_name=f"{task_dir.name}-{agent}",
        agent=AgentConfig(name=agent),
        environment=LOCAL_SANDBOX,
    )
    async with limit:
        result = await (await Trial.create(config)).run()
    if result.exception_info is not None:
        return f"{result.exception_info.exception_type}: {result.exception_info.exception_message}"
    return result.verifier_result.rewards if result.verifier_result else "no verifier result"


async def _run_all(jobs: list[tuple[Path, str]], trials_dir: Path) -> list[dict[str, float] | str]:
    limit = asyncio.Semaphore(CONCURRENCY)
    return await asyncio.gather(*(_rewards(task, agent, trials_dir, limit) for task, agent in jobs))


@pytest.mark.timeout(120)
def test_oracle_scores_one_and_nop_scores_zero_on_every_task(tmp_path: Path) -> None:
    jobs = [(task, agent) for task in TASK_DIRS for agent in ("oracle", "nop")]
    rewards = asyncio.run(_run_all(jobs, tmp_path))
    wrong = {
        (task.name, agent): reward
        for (task, agent), reward in zip(jobs, rewards, strict=True)
        if not isinstance(reward, dict) or reward.get("reward") != (1 if agent == "oracle" else 0)
    }
    assert wrong == {}


def _with_solution(tmp_path: Path, task: str, solve_sh: str) -> Path:
    """A copy of example ``task`` whose solution/solve.sh is ``solve_sh``: what the oracle agent will run."""
    copy = tmp_path / "tasks" / task
    shutil.copytree(EXAMPLES / task, copy)
    (copy / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve_sh)
    return copy


HALF_CONFIG_EDIT = """python3 - <<'EOF'
import json
config = json.load(open("/app/config.json"))
config["debug"] = True
json.dump(config, open("/app/config.json", "w"))
EOF
"""
ONE_OF_THREE_STATS_FIXES = """python3 - <<'EOF'
from pathlib import Path
stats = Path("/app/stats.py")
stats.write_text(stats.read_text().replace("/ (len(xs) - 1)", "/ len(xs)"))
EOF
"""
FAKE_REWARD_PRINTER = """cat > /app/wc.py <<'EOF'
print('{"reward": 1, "full_poem": 1, "full_ragged": 1, "lines_only": 1, "missing_file": 1}')
EOF
"""


@pytest.mark.timeout(60)
def test_partial_solutions_earn_partial_rewards_and_a_printed_fake_reward_earns_nothing(tmp_path: Path) -> None:
    jobs = [
        (_with_solution(tmp_path, "json-config-edit", HALF_CONFIG_EDIT), "oracle"),
        (_with_solution(tmp_path, "fix-stats-bugs", ONE_OF_THREE_STATS_FIXES), "oracle"),
        (_with_solution(tmp_path, "cli-word-count", FAKE_REWARD_PRINTER), "oracle"),
    ]
    config_edit, stats, word_count = asyncio.run(_run_all(jobs, tmp_path / "trials"))
    assert config_edit == {"reward": 0.5, "debug": 1, "port": 0, "preserved": 1}
    assert stats == pytest.approx({"reward": 1 / 3, "mean": 1.0, "median": 0.0, "variance": 0.0})
    assert word_count == {"reward": 0.0, "full_poem": 0, "full_ragged": 0, "lines_only": 0, "missing_file": 0}
