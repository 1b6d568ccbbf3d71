"""Every example task is a Harbor task that Harbor's own loader accepts, laid out as examples/tasks/README.md says,
with nothing of its solution or tests among the files the agent starts from."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from harbor.models.task.task import Task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASK_DIRS = sorted(path for path in EXAMPLES.iterdir() if path.is_dir() and not path.name.startswith("."))
HIDDEN_DIRS = ("solution", "tests")


def test_there_are_at_least_twelve_tasks_with_kebab_case_names() -> None:
    names = [path.name for path in TASK_DIRS]
    assert len(names) >= 12
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name) for name in names), names


def test_the_tasks_span_easy_to_hard_and_some_give_partial_credit() -> None:
    metadata = [Task(path).config.metadata for path in TASK_DIRS]
    difficulties = [meta["difficulty"] for meta in metadata]
    assert {"easy", "medium", "hard"} <= set(difficulties)
    assert sum(meta["partial_credit"] for meta in metadata) >= 3


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=lambda path: path.name)
def test_harbor_loads_the_task(task_dir: Path) -> None:
    assert Task.is_valid_dir(task_dir)
    task = Task(task_dir)
    assert task.name == task_dir.name and not task.has_steps
    assert task.instruction.strip() and len(task.instruction) < 600
    assert task.config.environment.workdir == "/app"
    assert task.config.agent.timeout_sec is not None and task.config.agent.timeout_sec <= 600
    assert task.config.verifier.timeout_sec <= 120


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=lambda path: path.name)
def test_the_scripts_are_executable_bash(task_dir: Path) -> None:
    for script in (task_dir / "solution" / "solve.sh", task_dir / "tests" / "test.sh"):
        assert script.read_text().startswith("#!/bin/bash\n"), script
        assert os.access(script, os.X_OK), script
    assert "/logs/verifier/reward.json" in (task_dir / "tests" / "test.sh").read_text()


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=lambda path: path.name)
def test_the_environment_starts_from_app_files_only(task_dir: Path) -> None:
    dockerfile = (task_dir / "environment" / "Dockerfile").read_text()
    assert "WORKDIR /app" in dockerfile
    app = task_dir / "environment" / "app"
    assert ("COPY app/ /app/" in dockerfile) == app.is_dir()
    assert sorted(path.name for path in (task_dir / "environment").iterdir()) == sorted(
        ["Dockerfile", *(["app"] if app.is_dir() else [])]
    )


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=lambda path: path.name)
def test_no_solution_or_test_text_and_no_history_in_what_the_agent_sees(task_dir: Path) -> None:
    assert not [path for path in task_dir.rglob("*") if path.name == ".git"]
    hidden = [path for name in HIDDEN_DIRS for path in (task_dir / name).rglob("*") if path.is_file()]
    hidden_bodies = [_body(path.read_text()) for path in hidden]
    for path in (task_dir / "environment").rglob("*"):
        if not path.is_file():
            continue
        assert path.name not in {h.name for h in hidden} | {"reward.txt", "reward.json"}, path
        text = path.read_text()
        assert not [body for body in hidden_bodies if body and body in text], path


def _body(script: str) -> str:
    """A file's text without its shebang line and surrounding blank lines: what copying it would leave behind."""
    return script.removeprefix("#!/bin/bash\n").strip()
