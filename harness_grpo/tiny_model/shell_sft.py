"""Shell-chore SFT for mini-swe-agent: the CLI's call format and a repertoire of commands, not the choice.

The tiny model cannot write a shell command from an instruction. This SFT gives it what a real CLI
needs before RL can start, the usual SFT-then-RL recipe in miniature (as ``tool_sft`` does for an
environment's tools): the request mini-swe-agent sends under ``SMALL_MODEL_PROMPT`` (that system prompt,
the task's instruction as the user turn, mini's ``bash`` tool), answered with one ``bash`` call, then,
after the tool's output, mini's submit command. The first command is one of ``CHORES``' commands,
**drawn uniformly whatever the instruction asks**, with the instruction's backticked names filled in
(``repertoire``). So the model calls the tool with commands about the task's own files, and which
command an instruction asks for is left to GRPO: on the easy tasks of ``examples/tasks`` (one per
chore) about one rollout in seven starts right, so rollouts earn the verifier's reward from the
first step; whether the policy then learns which chore each instruction names is measured by
``bench/cli_learning.py`` (the README has the figures).

The SFT sees the instructions only (``chore_chats``), no verifier and no solution. The tiny model does
not copy names it has not memorised (a version on synthetic instructions with random names wrote the
right kinds of command about made-up files), which is why it trains on the instructions it will be
asked. ``shell_chore_model(instructions)`` is the warm tiny model after this SFT, cached by
``tool_sft.tool_format_model`` under a digest of its chats and recipe.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent ends its run when a command's output starts with this line."""

MINI_BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}
"""mini-swe-agent 2.4.6's one tool, as it sends it (``tests/harbor/test_shell_sft.py`` checks a real run)."""

CHORES = {
    "write": "echo {w0} > {p0}",
    "append": "echo {w0} >> {p0}",
    "count": "wc -l < {p0} > {p1}",
    "mkdir": "mkdir -p {w0}",
    "move": "mv {p0} {p1}",
    "replace": "sed -i 's/{w0}/{w1}/g' {p0}",
    "sort": "sort -o {p0} {p0}",
}
"""Kinds of shell chore and the command that does each: ``{w0}``, ``{w1}`` are an instruction's words and
``{p0}``, ``{p1}`` its paths, in order (``repertoire``)."""

SHELL_SFT_RECIPE = {"seed": 0, "chats": 2048, "steps": 800, "batch": 8, "lr": 3e-3, "threads": 2}


def names_in(instruction: str) -> tuple[list[str], list[str]]:
    """``(words, paths)``: the instruction's backticked names in order; a path has a ``/`` or a ``.``."""
    names = re.findall(r"`([^`\s]+)`", instruction)
    paths = [name for name in names if "/" in name or "." in name]
    return [name for name in names if name not in paths], paths


def repertoire(instruction: str) -> dict[str, str]:
    """Each chore's command filled from ``instruction``'s names (``CHORES``); a slot the instruction has no
    name of its kind for takes its other names in turn (``out`` when it has none)."""
    words, paths = names_in(instruction)
    every = words + paths or ["out"]
    slots = {}
    for kind, names in (("w", words), ("p", paths)):
        pool = names + [name for name in every if name not in names]
        slots.update({f"{kind}{i}": pool[i % len(pool)] for i in range(2)})
    return {chore: command.format(**slots) for chore, command in CHORES.items()}


def _tool_output(rng: random.Random, command: str) -> str:
    """A plausible ``bash`` result as mini-swe-agent sends it back: mostly silent success, sometimes an error."""
    if rng.random() < 0.8:
        returncode, output = 0, ""
    else:
        returncode, output = 1, f"{command.split()[0]}: cannot complete: No such file or directory\n"
    return json.dumps({"returncode": returncode, "output": output}, indent=2)


def _call(index: int, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {"id": f"call_{index}", "type": "function", "function": {"name": "bash", "arguments": arguments}}


def chore_chats(
    instructions: Sequence[str], n: int, seed: int, system_prompt: str | None = None
) -> list[dict[str, Any]]:
    """``n`` mini-swe-agent chats (``{"messages", "tools"}``), each on an instruction drawn from
    ``instructions``: one ``bash`` call of a command drawn uniformly from its ``repertoire``, the tool's
    output, then the submit command."""
    from harness_grpo.agents import SMALL_MODEL_PROMPT

    if not instructions:
        raise ValueError("chore_chats needs at least one instruction")
    rng = random.Random(seed)
    chats = []
    for _ in range(n):
        instruction = rng.choice(instructions)
        command = rng.choice(sorted(set(repertoire(instruction).values())))
        messages = [
            {"role": "system", "content": system_prompt or SMALL_MODEL_PROMPT},
            {"role": "user", "content": instruction},
            {"role": "assistant", "content": "", "tool_calls": [_call(0, command)]},
            {"role": "tool", "tool_call_id": "call_0", "content": _tool_output(rng, command)},
            {"role": "assistant", "content": "", "tool_calls": [_call(1, SUBMIT_COMMAND)]},
        ]
        chats.append({"messages": messages, "tools": [MINI_BASH_TOOL]})
    return chats


def shell_chore_model(instructions: Sequence[str], recipe: dict[str, Any] = SHELL_SFT_RECIPE) -> Path:
    """The warm tiny model after the shell-chore SFT on ``instructions`` (module docstring), built once and
    cached."""
    from harness_grpo.tiny_model.tool_sft import tool_format_model
    from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

    chats = chore_chats(sorted(set(instructions)), recipe["chats"], recipe["seed"])
    return tool_format_model(warm_tiny_model_path(), chats, recipe)


def command_of(arguments: str | dict[str, Any] | None) -> str | None:
    """The ``command`` of a ``bash`` call's arguments (JSON text or parsed), or None."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    command = arguments.get("command") if isinstance(arguments, dict) else None
    return command if isinstance(command, str) else None


def chore_of(instruction: str, command: str | None) -> str | None:
    """Which chore's command, filled from ``instruction``, ``command`` is; None for any other command."""
    if command is None:
        return None
    return next((chore for chore, candidate in repertoire(instruction).items() if command.strip() == candidate), None)
