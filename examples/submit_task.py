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
