"""Shell-chore SFT for the CLI agents: each CLI's call format and a repertoire of commands, not the choice.

The tiny model cannot write a shell command from an instruction. This SFT gives it what a real CLI
needs before RL can start, the usual SFT-then-RL recipe in miniature (as ``tool_sft`` does for an
environment's tools): the very request the CLI sends under ``SMALL_MODEL_PROMPT``, answered with one call of
its shell tool, then, after the tool's output, how that CLI ends a run (mini-swe-agent's submit command, a
short text answer for the others). The command is one of ``CHORES``' commands, **drawn uniformly whatever the
instruction asks**, with the instruction's backticked names filled in (``repertoire``). So the model calls the
tool with commands about the task's own files, and which command an instruction asks for is left to GRPO: on
the easy tasks of ``examples/tasks`` (one per chore) about one rollout in seven starts right, so rollouts earn
the verifier's reward from the first step; whether the policy then learns which chore each instruction names
is measured by ``bench/cli_learning.py`` (the README has the figures).

The requests: mini-swe-agent's is written here (``MINI_BASH_TOOL``); opencode's, codex's and claude-code's are
captured ``AgentRequest`` records, from real runs (``agent_requests/<agent>.json``: the first request with tools,
its shell tool, the result of a command that printed nothing), with what varies between runs marked:
``<<instruction>>``, ``<<date:FORMAT>>``, ``<<model>>`` (the served model name), ``<<os_version>>``,
``<<claude_fingerprint>>``, and in codex's tool result ``<<chunk_id>>`` and ``<<wall_s>>``.
``tests/harbor/test_shell_sft.py`` checks each against a real run, so a CLI upgrade that changes its request
fails there. The captures assume the task's working directory is ``/app`` (Harbor's convention, every example
task's).

The SFT sees the instructions only (``chore_chats``), no verifier and no solution. The tiny model does
not copy names it has not memorised (a version on synthetic instructions with random names wrote the
right kinds of command about made-up files), which is why it trains on the instructions it will be
asked. ``shell_chore_model(instructions, agent)`` is the warm tiny model after this SFT, cached by
``tool_sft.tool_format_model`` under a digest of its chats and recipe.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
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

AGENT_REQUESTS = Path(__file__).with_name("agent_requests")
SERVED_MODEL = "policy"
"""The model name agents send in training (``RolloutContext.model_name``), which opencode and claude-code quote."""
DATES = tuple(datetime.date(2025, 1, 1) + datetime.timedelta(days=97 * i) for i in range(8))
"""The dates the chats show where a CLI writes today's: a few, so that the model learns to pass over them."""
CLOSING = "Done."

SHELL_SFT_RECIPE = {"seed": 0, "chats": 2048, "steps": 800, "batch": 8, "lr": 3e-3, "threads": 2}
CAPTURED_SFT_RECIPE = {**SHELL_SFT_RECIPE, "steps": 300, "batch": 16}
"""For codex's captured request: 1.6k prompt tokens where mini's has about 150, and a step's cost is mostly its
prompt's forward pass, so fewer, larger steps: under 5 minutes on 2 cores, after which 101 of 112 first calls sampled
on the easy tasks are a chore's command (17 the right one)."""
SFT_RECIPES = {
    "mini-swe-agent": SHELL_SFT_RECIPE,
    "opencode": SHELL_SFT_RECIPE,
    "codex": CAPTURED_SFT_RECIPE,
    "claude-code": SHELL_SFT_RECIPE,
}
"""Each CLI's default recipe. claude-code's request puts the instruction before a system message of its own
(the environment: directory, platform, date), so the names to copy are about 200 tokens back: 300 steps of 16 left
3 of 112 first calls sampled on the easy tasks a chore's command (loss 0.35); 800 steps of 8 leave 71 of 112, 9 the
right one (loss 0.07). opencode's 300 steps of 16 gave 102 of 112 on one machine and 18 on another (an AMD EPYC
with AVX2; same code and recipe, so other float rounding or library builds), so it gets 800 steps of 8: 112 of 112
there, 19 the right one, sampled on the prompts of real opencode trials (5.5 minutes on 2 cores)."""
SHELL_CHORE_AGENTS = tuple(SFT_RECIPES)
"""The CLIs whose shell-chore SFT model the launcher trains by default: those with a recipe."""


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


@dataclass(frozen=True)
class AgentRequest:
    """A CLI's first request with tools under ``SMALL_MODEL_PROMPT``, captured from a real run (module docstring)."""

    agent: str
    version: str
    instruction_quoting: str | None
    shell_tool: str
    command_argument: str
    silent_result: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]

    def prompt(self, instruction: str, today: datetime.date, model: str = SERVED_MODEL) -> list[dict[str, Any]]:
        """The messages the CLI sends for ``instruction`` on ``today`` with ``model`` served, on this machine."""
        shown = instruction
        if self.instruction_quoting == "opencode-run" and " " in instruction:  # how ``opencode run`` joins its words
            shown = '"' + instruction.replace('"', '\\"') + '"'
        fills = {
            "instruction": shown,
            "model": model,
            "os_version": f"{platform.system()} {platform.release()}",
            "claude_fingerprint": claude_fingerprint(instruction, self.version),
        }

        def fill(match: re.Match[str]) -> str:
            name, _, argument = match.group(1).partition(":")
            return today.strftime(argument) if name == "date" else fills[name]

        return [
            {**message, "content": re.sub(r"<<([a-z_]+(?::[^>]*)?)>>", fill, message["content"])}
            for message in self.messages
        ]

    def result(self, rng: random.Random) -> str:
        """The CLI's tool message for a command that printed nothing (codex's ``<<chunk_id>>`` drawn from ``rng``,
        its ``<<wall_s>>`` a fast command's)."""
        chunk = f"{rng.getrandbits(24):06x}"
        return self.silent_result.replace("<<chunk_id>>", chunk).replace("<<wall_s>>", "0.0000")

    def result_pattern(self) -> str:
        """A regex that the tool message of any command that printed nothing matches."""
        pattern = re.escape(self.silent_result)
        return pattern.replace(re.escape("<<chunk_id>>"), "[0-9a-f]{6}").replace(re.escape("<<wall_s>>"), r"\d+\.\d+")

    def call(self, index: int, command: str) -> dict[str, Any]:
        """A call of the CLI's shell tool running ``command``."""
        arguments = json.dumps({self.command_argument: command})
        function = {"name": self.shell_tool, "arguments": arguments}
        return {"id": f"call_{index}", "type": "function", "function": function}


@cache
def agent_request(agent: str) -> AgentRequest:
    """The captured request of ``agent`` (opencode, codex or claude-code)."""
    path = AGENT_REQUESTS / f"{agent}.json"
    if not path.is_file():
        known = sorted(path.stem for path in AGENT_REQUESTS.glob("*.json"))
        raise ValueError(f"no captured request for {agent!r}: there are {', '.join(['mini-swe-agent', *known])}")
    return AgentRequest(**json.loads(path.read_text()))


def claude_fingerprint(first_user_text: str, version: str) -> str:
    """The three hex digits claude-code appends to ``cc_version`` in its system prompt (claude-code's own
    attribution fingerprint: characters 4, 7 and 20 of the first user message, salted, with the version)."""
    chars = "".join(first_user_text[i] if i < len(first_user_text) else "0" for i in (4, 7, 20))
    return hashlib.sha256(f"59cf53e54c78{chars}{version}".encode()).hexdigest()[:3]


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
    instructions: Sequence[str], n: int, seed: int, agent: str = "mini-swe-agent", system_prompt: str | None = None
) -> list[dict[str, Any]]:
    """``n`` chats (``{"messages", "tools"}``) of ``agent``, each on an instruction drawn from ``instructions``:
    its request, one shell call of a command drawn uniformly from the instruction's ``repertoire``, the tool's
    output, then mini-swe-agent's submit command or, for the others, a short answer. ``system_prompt``
    replaces ``SMALL_MODEL_PROMPT`` in mini-swe-agent's request (the others' are as captured)."""
    from harness_grpo.agents import SMALL_MODEL_PROMPT

    if not instructions:
        raise ValueError("chore_chats needs at least one instruction")
    request = None if agent == "mini-swe-agent" else agent_request(agent)
    rng = random.Random(seed)
    chats = []
    for _ in range(n):
        instruction = rng.choice(instructions)
        command = rng.choice(sorted(set(repertoire(instruction).values())))
        if request is not None:
            messages = [
                *request.prompt(instruction, rng.choice(DATES)),
                {"role": "assistant", "content": "", "tool_calls": [request.call(0, command)]},
                {"role": "tool", "tool_call_id": "call_0", "content": request.result(rng)},
                {"role": "assistant", "content": CLOSING},
            ]
            chats.append({"messages": messages, "tools": request.tools})
            continue
        messages = [
            {"role": "system", "content": system_prompt or SMALL_MODEL_PROMPT},
            {"role": "user", "content": instruction},
            {"role": "assistant", "content": "", "tool_calls": [_call(0, command)]},
            {"role": "tool", "tool_call_id": "call_0", "content": _tool_output(rng, command)},
            {"role": "assistant", "content": "", "tool_calls": [_call(1, SUBMIT_COMMAND)]},
        ]
        chats.append({"messages": messages, "tools": [MINI_BASH_TOOL]})
    return chats


def shell_chore_model(
    instructions: Sequence[str], agent: str = "mini-swe-agent", recipe: dict[str, Any] | None = None
) -> Path:
    """The warm tiny model after the shell-chore SFT of ``agent`` on ``instructions`` (module docstring), built
    once and cached; ``recipe`` defaults to the agent's ``SFT_RECIPES``."""
    from harness_grpo.tiny_model.tool_sft import tool_format_model
    from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

    if recipe is None:
        recipe = SFT_RECIPES[agent]

    chats = chore_chats(sorted(set(instructions)), recipe["chats"], recipe["seed"], agent)
    return tool_format_model(warm_tiny_model_path(), chats, recipe)


def command_of(arguments: str | dict[str, Any] | None, key: str = "command") -> str | None:
    """The command (``key``: ``command``, codex's ``cmd``) of a shell call's arguments (JSON text or parsed), or
    None."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    command = arguments.get(key) if isinstance(arguments, dict) else None
    return command if isinstance(command, str) else None


def chore_of(instruction: str, command: str | None) -> str | None:
    """Which chore's command, filled from ``instruction``, ``command`` is; None for any other command."""
    if command is None:
        return None
    return next((chore for chore, candidate in repertoire(instruction).items() if command.strip() == candidate), None)
