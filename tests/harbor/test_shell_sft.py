"""The shell-chore SFT (``harness_grpo.tiny_model.shell_sft``) against the real CLIs and its own models.

For each CLI (mini-swe-agent, opencode, codex, claude-code), its chats are the requests the CLI really sends under
``SMALL_MODEL_PROMPT`` (a real Harbor trial on an easy example task, the fake engine answering with a tool call:
the first request with tools, and the tool result in the second), so a CLI upgrade that changes them fails here;
and the model it trains calls the CLI's shell tool with a command of the instruction's repertoire from the
first step, the right one for about one rollout in seven: reward to learn from, no task solved by the SFT.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harness_grpo.agents import SMALL_MODEL_PROMPT, agent_binary
from harness_grpo.engine.tool_parser import parse_tool_calls
from harness_grpo.harbor_tasks import load_task_dataset
from harness_grpo.rollouts import run_rollout
from harness_grpo.tiny_model.shell_sft import (
    DATES,
    MINI_BASH_TOOL,
    SHELL_CHORE_AGENTS,
    agent_request,
    chore_chats,
    chore_of,
    command_of,
    shell_chore_model,
)
from tests.agents.conftest import AgentStack
from tests.harbor.conftest import AGENT_MODEL, bound_factory
from tests.tasks.test_shell_chores import CHORE_OF_TASK, EXAMPLES

SAMPLES = 16


def _installed(agent: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(agent_binary(agent) is None, reason=f"{agent} is not installed")


AGENTS = [pytest.param(agent, marks=_installed(agent)) for agent in SHELL_CHORE_AGENTS]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("agent", AGENTS)
def test_the_sft_chats_are_the_requests_each_cli_sends(agent_stack: AgentStack, tmp_path: Path, agent: str) -> None:
    row = load_task_dataset(EXAMPLES / "create-hello-file")[0]
    instruction = row["prompt"][0]["content"]
    factory = bound_factory(
        agent_stack,
        harness=agent,
        sampling={"temperature": 1.0},
        max_model_calls=3,
        max_output_tokens=64,
        system_prompt=SMALL_MODEL_PROMPT,
        trials_dir=tmp_path / "trials",
        trial_grace_s=30.0,  # a trial that hangs ends with where it waits logged, before the test's timeout
    )
    mark = len(agent_stack.relay.served)
    outcome = run_rollout(factory, row, seed=0, timeout_s=180, sampling={"temperature": 1.0})
    assert outcome.error is None and not outcome.timed_out, outcome.error or "the trial timed out (see the log)"
    served = [call.request for call in agent_stack.served_since(mark) if not call.is_probe]
    first, second = [request for request in served if request.get("tools")][:2]  # opencode's title call has none
    chat = chore_chats([instruction], 1, seed=0, agent=agent)[0]
    result = second["messages"][len(first["messages"]) + 1]  # the fake engine's command (an echo into a file)
    if agent == "mini-swe-agent":
        assert first["messages"] == chat["messages"][:2]
        assert first["tools"] == chat["tools"] == [MINI_BASH_TOOL]
        assert result["role"] == "tool" and result["content"] == json.dumps({"returncode": 0, "output": ""}, indent=2)
        return
    request = agent_request(agent)
    today = datetime.datetime.now(datetime.UTC).date()
    assert first["messages"] == request.prompt(instruction, today, model=AGENT_MODEL), f"{agent} changed its request"
    assert first["tools"] == chat["tools"] == request.tools
    shown = chat["messages"][: len(first["messages"])]
    assert any(shown == request.prompt(instruction, day) for day in DATES), "the SFT chat is not the CLI's request"
    assert result["role"] == "tool" and re.fullmatch(request.result_pattern(), result["content"]), result["content"]
    call = second["messages"][len(first["messages"])]["tool_calls"][0]["function"]
    assert call["name"] == request.shell_tool and request.command_argument in json.loads(call["arguments"])


def _first_commands(model: Path, agent: str, instruction: str) -> list[str | None]:
    """The commands of ``SAMPLES`` first calls sampled at temperature 1 in ``agent``'s request (None where no call
    of its shell tool parses)."""
    if agent == "mini-swe-agent":
        messages = [{"role": "system", "content": SMALL_MODEL_PROMPT}, {"role": "user", "content": instruction}]
        tools, shell, key = [MINI_BASH_TOOL], "bash", "command"
    else:
        request = agent_request(agent)
        messages = request.prompt(instruction, datetime.datetime.now(datetime.UTC).date())
        tools, shell, key = request.tools, request.shell_tool, request.command_argument
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model)
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=True)
    prompt = prompt["input_ids"]
    torch.manual_seed(0)
    out = policy.generate(
        torch.tensor([prompt] * SAMPLES),
        attention_mask=torch.ones(SAMPLES, len(prompt), dtype=torch.long),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        max_new_tokens=80,
        pad_token_id=tokenizer.pad_token_id,
    )
    commands = []
    for row in out:
        _, calls = parse_tool_calls(tokenizer.decode(row[len(prompt) :], skip_special_tokens=False))
        shell_calls = [call["function"]["arguments"] for call in calls[:1] if call["function"]["name"] == shell]
        commands.append(command_of(shell_calls[0], key) if shell_calls else None)
    return commands


@pytest.mark.timeout(600)
@pytest.mark.parametrize("agent", SHELL_CHORE_AGENTS)
def test_the_sft_model_draws_commands_of_the_repertoire_not_the_answers(agent: str) -> None:
    instructions = {task: load_task_dataset(EXAMPLES / task)[0]["prompt"][0]["content"] for task in CHORE_OF_TASK}
    model = shell_chore_model(list(instructions.values()), agent)
    right = in_repertoire = 0
    for task, instruction in instructions.items():
        chores = [chore_of(instruction, command) for command in _first_commands(model, agent, instruction)]
        in_repertoire += sum(chore is not None for chore in chores)
        hits = chores.count(CHORE_OF_TASK[task])
        assert hits <= SAMPLES // 2, f"{task}: the SFT taught the answer ({hits}/{SAMPLES})"
        right += hits
    total = SAMPLES * len(instructions)
    assert in_repertoire >= total // 2, f"{in_repertoire}/{total} first commands are the instruction's chores"
    assert right >= 5, f"{right}/{total} first commands are right: too few to learn from"
