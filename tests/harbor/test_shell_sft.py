"""The shell-chore SFT (``harness_grpo.tiny_model.shell_sft``) against the real mini-swe-agent and its own model.

Its chats are the requests mini-swe-agent really sends under ``SMALL_MODEL_PROMPT`` (a real Harbor trial of the
CLI on an easy example task, the fake engine answering with a tool call: the first request's messages and tools,
and the tool result of the second); and the model it trains calls the ``bash`` tool with a command of the
instruction's repertoire from the first step, the right one for about one rollout in seven: reward to learn
from, no task solved by the SFT.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harness_grpo.agents import SMALL_MODEL_PROMPT, agent_binary
from harness_grpo.engine.tool_parser import parse_tool_calls
from harness_grpo.harbor_tasks import load_task_dataset
from harness_grpo.rollouts import run_rollout
from harness_grpo.tiny_model.shell_sft import MINI_BASH_TOOL, chore_chats, chore_of, command_of, shell_chore_model
from tests.agents.conftest import AgentStack
from tests.harbor.conftest import bound_factory
from tests.tasks.test_shell_chores import CHORE_OF_TASK, EXAMPLES

pytestmark = pytest.mark.skipif(agent_binary("mini-swe-agent") is None, reason="mini-swe-agent is not installed")
SAMPLES = 16


@pytest.mark.timeout(240)
def test_the_sft_chats_are_the_requests_mini_swe_agent_sends(agent_stack: AgentStack, tmp_path: Path) -> None:
    row = load_task_dataset(EXAMPLES / "create-hello-file")[0]
    instruction = row["prompt"][0]["content"]
    factory = bound_factory(
        agent_stack,
        harness="mini-swe-agent",
        sampling={"temperature": 1.0},
        max_model_calls=2,
        max_output_tokens=64,
        system_prompt=SMALL_MODEL_PROMPT,
        trials_dir=tmp_path / "trials",
    )
    mark = len(agent_stack.relay.served)
    outcome = run_rollout(factory, row, seed=0, timeout_s=180, sampling={"temperature": 1.0})
    assert outcome.error is None, outcome.error
    first, second = [call.request for call in agent_stack.served_since(mark) if not call.is_probe][:2]
    chat = chore_chats([instruction], 1, seed=0)[0]
    assert first["messages"] == chat["messages"][:2]
    assert first["tools"] == chat["tools"] == [MINI_BASH_TOOL]
    result = second["messages"][3]  # the fake engine's command (an echo into a file) succeeded silently
    assert result["role"] == "tool" and result["content"] == json.dumps({"returncode": 0, "output": ""}, indent=2)


def _first_commands(model: Path, instruction: str) -> list[str | None]:
    """The commands of ``SAMPLES`` first calls sampled at temperature 1 (None where no ``bash`` call parses)."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model)
    messages = [{"role": "system", "content": SMALL_MODEL_PROMPT}, {"role": "user", "content": instruction}]
    prompt = tokenizer.apply_chat_template(
        messages, tools=[MINI_BASH_TOOL], add_generation_prompt=True, return_dict=True
    )["input_ids"]
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
        bash = [call["function"]["arguments"] for call in calls[:1] if call["function"]["name"] == "bash"]
        commands.append(command_of(bash[0]) if bash else None)
    return commands


@pytest.mark.timeout(600)
def test_the_sft_model_draws_commands_of_the_repertoire_not_the_answers() -> None:
    instructions = {task: load_task_dataset(EXAMPLES / task)[0]["prompt"][0]["content"] for task in CHORE_OF_TASK}
    model = shell_chore_model(list(instructions.values()))
    right = in_repertoire = 0
    for task, instruction in instructions.items():
        chores = [chore_of(instruction, command) for command in _first_commands(model, instruction)]
        in_repertoire += sum(chore is not None for chore in chores)
        hits = chores.count(CHORE_OF_TASK[task])
        assert hits <= SAMPLES // 2, f"{task}: the SFT taught the answer ({hits}/{SAMPLES})"
        right += hits
    total = SAMPLES * len(instructions)
    assert in_repertoire >= total // 2, f"{in_repertoire}/{total} first commands are the instruction's chores"
    assert right >= 5, f"{right}/{total} first commands are right: too few to learn from"
