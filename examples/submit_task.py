"""A small verifiable task for the black-box ``examples/agents/tool_agent.py``: finish by submitting.

The agent is offered four tools (list_files, read_file, echo, submit) and a prompt that
asks it to submit. The verifier looks only at the end state of the agent's
working directory: 1.0 if ``submission.txt`` exists (the agent called
``submit``), else 0.0. A warm-started tiny model picks among the offered
tools more or less at random, so the reward starts well between 0 and 1 and
GRPO can raise it: it is the CPU learning check of the trainer, not a
benchmark of intelligence.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

AGENT = Path(__file__).resolve().parent / "agents" / "tool_agent.py"

PROMPTS = [
    "Finish the task: call submit with your answer.",
    "You are done. Submit the answer now.",
    "Use the submit tool to hand in the result.",
    "Submit the word hello as the answer.",
    "The work is complete; submit it.",
    "Call submit to finish.",
    "Please submit your final answer.",
    "Hand in the answer with submit.",
]


def dataset() -> list[dict[str, Any]]:
    """One task row per prompt."""
    return [{"prompt": p} for p in PROMPTS]


def setup(workdir: Path, task: Mapping[str, Any]) -> None:
    """The agent's starting directory."""
    (workdir / "notes.txt").write_text("Remember to submit.\n")


def verifier(workdir: Path, task: Mapping[str, Any]) -> float:
    """1.0 when the agent submitted (``submission.txt`` exists), else 0.0."""
    return 1.0 if (workdir / "submission.txt").exists() else 0.0


def agent_command(max_turns: int = 1, max_tokens: int = 96) -> list[str]:
    """The agent's argv; ``{prompt}`` is filled per task by the session factory."""
    return [sys.executable, str(AGENT), "{prompt}", "--max-turns", str(max_turns), "--max-tokens", str(max_tokens)]


TASK_SFT_RECIPE = {"seed": 0, "steps": 120, "batch": 8, "lr": 3e-3}


def _example_call(rng: random.Random) -> dict[str, Any]:
    """A well-formed call to one of the agent's tools, chosen uniformly: the SFT teaches the format, not the choice."""
    from examples.agents.tool_agent import TOOLS

    name = rng.choice([t["function"]["name"] for t in TOOLS])
    arguments = {
        "list_files": {"directory": "."},
        "read_file": {"path": "notes.txt"},
        "echo": {"text": rng.choice(["hello", "done", "ready"])},
        "submit": {"answer": rng.choice(["hello", "done", "42"])},
    }[name]
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def task_sft(base: Path, dest: Path, recipe: Mapping[str, Any] = TASK_SFT_RECIPE) -> Path:
    """Teach ``base`` the agent's tool-call format on this task's prompts (tools chosen at random), into ``dest``.

    This is the usual SFT-then-RL recipe in miniature: afterwards the model calls one of the four tools
    more or less uniformly, so ``submit`` (reward 1) is one choice among four and GRPO has to learn it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.agents.tool_agent import SYSTEM_PROMPT, TOOLS

    rng = random.Random(recipe["seed"])
    torch.manual_seed(recipe["seed"])
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"])
    model.train()
    for _ in range(recipe["steps"]):
        rows = []
        for _ in range(recipe["batch"]):
            messages = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": rng.choice(PROMPTS)},
                {"role": "assistant", "content": "", "tool_calls": [_example_call(rng)]},
            ]
            out = tokenizer.apply_chat_template(
                messages, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            rows.append((list(out["input_ids"]), list(out["assistant_masks"])))
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        for i, (row_ids, mask) in enumerate(rows):
            ids[i, : len(row_ids)] = torch.tensor(row_ids)
            labels[i, : len(row_ids)] = torch.tensor([t if m else -100 for t, m in zip(row_ids, mask, strict=True)])
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    (dest / "task_sft.json").write_text(json.dumps({"recipe": dict(recipe), "final_loss": float(loss)}))
    return dest


def task_model_path() -> Path:
    """The tiny model after ``task_sft``, cached by a digest of the base model, the recipe and this file."""
    from harness_grpo.tiny_model.build import cached_build, tiny_model_path

    base = tiny_model_path()
    digest = hashlib.sha256((base.name + json.dumps(TASK_SFT_RECIPE) + Path(__file__).read_text()).encode())
    digest.update(AGENT.read_bytes())
    return cached_build(f"submit-task-{digest.hexdigest()[:16]}", lambda dest: task_sft(base, dest))
