"""The shell-chore SFT's repertoire against the example tasks' real verifiers, and its chats.

Every easy task of ``examples/tasks`` is done by its chore's command of its ``repertoire``, in a real Harbor
trial in the local sandbox (the oracle agent running that command as the task's solution), and by no other
command but, for ``create-hello-file``, appending to the file it creates: so a policy that learns which chore an
instruction asks for earns the reward, and one that picks at random earns about one in seven.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest
from harbor.models.task.task import Task

from harness_grpo.agents import SMALL_MODEL_PROMPT
from harness_grpo.tiny_model.shell_sft import (
    CHORES,
    CLOSING,
    DATES,
    MINI_BASH_TOOL,
    SUBMIT_COMMAND,
    agent_request,
    chore_chats,
    chore_of,
    claude_fingerprint,
    command_of,
    names_in,
    repertoire,
)
from tests.tasks.test_oracle_and_nop import EXAMPLES, _run_all

ALSO_DONE_BY = {"create-hello-file": "append"}
"""The one other chore whose command does a task: appending to a file that does not exist creates it."""
CHORE_OF_TASK = {
    "append-line": "append",
    "count-lines": "count",
    "create-hello-file": "write",
    "make-directory": "mkdir",
    "rename-file": "move",
    "replace-word": "replace",
    "sort-lines": "sort",
}
"""Which chore each easy example task asks for: the answer key the policy has to learn."""


def _instruction(task: str) -> str:
    return Task(EXAMPLES / task).instruction


def test_the_easy_tasks_are_the_chores() -> None:
    easy = sorted(
        path.name
        for path in EXAMPLES.iterdir()
        if (path / "task.toml").is_file() and Task(path).config.metadata.get("difficulty") == "easy"
    )
    assert easy == sorted(CHORE_OF_TASK)
    assert sorted(CHORE_OF_TASK.values()) == sorted(CHORES)


def test_names_and_repertoire_of_an_instruction() -> None:
    instruction = "In `/app/notes.txt`, replace every occurrence of `colour` with `color`. Change nothing else."
    assert names_in(instruction) == (["colour", "color"], ["/app/notes.txt"])
    commands = repertoire(instruction)
    assert commands["replace"] == "sed -i 's/colour/color/g' /app/notes.txt"
    assert commands["move"] == "mv /app/notes.txt colour"  # no second path: the slot takes the other names
    assert repertoire("Do something.")["mkdir"] == "mkdir -p out"
    assert chore_of(instruction, " sed -i 's/colour/color/g' /app/notes.txt\n") == "replace"
    assert chore_of(instruction, "ls") is None and chore_of(instruction, None) is None
    assert command_of('{"command": "ls"}') == "ls" and command_of({"command": 3}) is None and command_of("{") is None


def test_chats_call_a_uniformly_drawn_command_then_submit() -> None:
    instructions = [_instruction(task) for task in sorted(CHORE_OF_TASK)]
    chats = chore_chats(instructions, 700, seed=3)
    drawn = []
    for chat in chats:
        system, user, call, result, submit = chat["messages"]
        assert system == {"role": "system", "content": SMALL_MODEL_PROMPT}
        assert user["role"] == "user" and user["content"] in instructions
        assert chat["tools"] == [MINI_BASH_TOOL]
        command = command_of(call["tool_calls"][0]["function"]["arguments"])
        assert command in repertoire(user["content"]).values()
        assert set(json.loads(result["content"])) == {"returncode", "output"}
        assert command_of(submit["tool_calls"][0]["function"]["arguments"]) == SUBMIT_COMMAND
        drawn.append(chore_of(user["content"], command) == CHORE_OF_TASK[_task_of(user["content"])])
    # the right command as often as a uniform draw among an instruction's distinct commands gives it
    assert 0.10 < sum(drawn) / len(drawn) < 0.20
    assert chore_chats(instructions, 5, seed=3) == chats[:5]
    with pytest.raises(ValueError):
        chore_chats([], 1, seed=0)


@pytest.mark.parametrize("agent", ["opencode", "codex", "claude-code"])
def test_chats_of_a_captured_cli_are_its_request_a_shell_call_and_an_answer(agent: str) -> None:
    request = agent_request(agent)
    instructions = [_instruction(task) for task in sorted(CHORE_OF_TASK)]
    chats = chore_chats(instructions, 300, seed=3, agent=agent)
    drawn = []
    for chat in chats:
        width = len(request.messages)
        prompt, (call, result, answer) = chat["messages"][:width], chat["messages"][width:]
        instruction = next(i for i in instructions if any(prompt == request.prompt(i, day) for day in DATES))
        assert chat["tools"] == request.tools
        function = call["tool_calls"][0]["function"]
        assert function["name"] == request.shell_tool
        command = command_of(function["arguments"], request.command_argument)
        assert command in repertoire(instruction).values()
        assert result["role"] == "tool" and re.fullmatch(request.result_pattern(), result["content"])
        assert answer == {"role": "assistant", "content": CLOSING}
        drawn.append(chore_of(instruction, command) == CHORE_OF_TASK[_task_of(instruction)])
    assert 0.08 < sum(drawn) / len(drawn) < 0.22
    assert chore_chats(instructions, 5, seed=3, agent=agent) == chats[:5]
    with pytest.raises(ValueError, match="no captured request"):
        chore_chats(instructions, 1, seed=0, agent="aider")


def test_claude_code_fingerprint_is_its_own() -> None:
    """The digits a real claude-code 2.1.328 run sent for two example tasks (``cc_version=2.1.328.<digits>``)."""
    assert claude_fingerprint(_instruction("create-hello-file"), "2.1.328") == "ec3"
    assert claude_fingerprint(_instruction("sort-lines"), "2.1.328") == "3da"


def _task_of(instruction: str) -> str:
    return next(task for task in CHORE_OF_TASK if _instruction(task) == instruction)


def _with_solution(tmp_path: Path, task: str, command: str, tag: str) -> Path:
    copy = tmp_path / "tasks" / f"{task}-{tag}"
    shutil.copytree(EXAMPLES / task, copy)
    (copy / "solution" / "solve.sh").write_text(f"#!/bin/bash\ncd /app\n{command}\n")
    return copy


@pytest.mark.timeout(180)
def test_each_easy_task_is_done_by_its_chores_command_and_by_no_other(tmp_path: Path) -> None:
    jobs, expected = [], []
    for task, chore in CHORE_OF_TASK.items():
        for name, command in repertoire(_instruction(task)).items():
            jobs.append((_with_solution(tmp_path, task, command, name), "oracle"))
            expected.append(1 if name in (chore, ALSO_DONE_BY.get(task)) else 0)
    rewards = asyncio.run(_run_all(jobs, tmp_path / "trials"))
    got = [reward.get("reward") if isinstance(reward, dict) else reward for reward in rewards]
    wrong = {job[0].name: (w, r) for job, w, r in zip(jobs, expected, got, strict=True) if w != r}
    assert wrong == {}
