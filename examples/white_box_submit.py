"""The submit task in white-box mode: the trainer's own tool loop instead of an agent process.

``SubmitTaskSessionFactory`` is the task's environment (a scratch directory and the task's verifier,
``examples/submit_task.py``); ``SubmitToolLoop`` is the ``harness_adapter``: it runs the same tools
as ``examples/agents/tool_agent.py`` in-process, calling the model through ``model_step`` (the
capture proxy, under the rollout's session key), until the model answers without a tool call, it
submits, or ``limits.max_turns`` calls are spent. Pass both to the trainer::

    HarnessAsyncGRPOTrainer(model, SubmitTaskSessionFactory, args, submit_task.dataset(),
                            harness_adapter=SubmitToolLoop())
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from examples import submit_task
from examples.agents.tool_agent import SYSTEM_PROMPT, TOOLS, run_tool
from harness_grpo.session_protocol import VerifyResult, instruction_of
from harness_grpo.white_box import HarnessRunLimits, ModelStep


class SubmitTaskSession:
    """One task's environment: a fresh working directory, verified by ``submit_task.verifier``."""

    def __init__(self, prompt: Any) -> None:
        self.task = {"prompt": instruction_of(prompt)}
        self.workdir = Path(tempfile.mkdtemp(prefix="white-box-"))
        submit_task.setup(self.workdir, self.task)

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        return VerifyResult(env_reward=submit_task.verifier(self.workdir, self.task))

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


class SubmitTaskSessionFactory:
    """Built by the trainer as ``SubmitTaskSessionFactory(sampling=...)``; the white-box wrapper pins the sampling."""

    def __init__(self, sampling: dict[str, Any] | None = None) -> None:
        self.sampling = sampling

    def create(self, prompt: Any, seed: int | None = None, episode_id: str | None = None) -> SubmitTaskSession:
        return SubmitTaskSession(prompt)


class SubmitToolLoop:
    """The white-box tool loop for ``SubmitTaskSession``s."""

    def run_white_box(self, model_step: ModelStep, session: SubmitTaskSession, limits: HarnessRunLimits) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": str(session.task["prompt"])},
        ]
        for _ in range(limits.max_turns):
            message = model_step(messages, TOOLS)
            calls = message.get("tool_calls") or []
            messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls or None})
            if not calls:
                return
            finished = False
            for call in calls:
                output, done = run_tool(call["function"]["name"], call["function"]["arguments"], session.workdir)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
                finished = finished or done
            if finished:
                return
