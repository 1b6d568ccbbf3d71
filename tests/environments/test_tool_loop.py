"""The built-in tool loop's own logic, driven by a scripted model (a fake of the model, named so).

``ScriptedModel`` answers from a script and counts tokens as the engine does for a prefix-preserving
template: the first prompt is 20 tokens; each later prompt is the previous prompt, the previous reply
and the tool results (``suffix``: one token per character, plus 5). So these tests check what the loop
does with replies (parallel calls, failures, unknown names, the iteration cap, the token budget, the
proxy's budget answer, a timeout), not the model; the real engine and proxy run the same loop in
``test_environment_training.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from harness_grpo.environments import Environments
from harness_grpo.tool_loop import Episode, ToolLoopLimits, run_tool_loop
from harness_grpo.white_box import ToolReport


def suffix(tool_messages: list[dict[str, Any]]) -> int:
    return sum(len(m["content"]) for m in tool_messages) + 5


def call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def reply(*calls: dict[str, Any], content: str | None = None, tokens: int = 10) -> tuple[dict[str, Any], int]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}, tokens


class ScriptedModel:
    """A fake model: the next scripted reply per request (see the module docstring for its token counts)."""

    def __init__(self, script: list[tuple[dict[str, Any], int]]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self._last: tuple[int, int, int] | None = None  # prompt length, reply length, messages sent

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(copy.deepcopy(body))
        messages = body["messages"]
        if self._last is None:
            prompt = 20
        else:
            last_prompt, last_reply, sent = self._last
            tools = messages[sent + 1 :]
            assert tools and all(m["role"] == "tool" for m in tools), "a later request adds the reply and tool results"
            prompt = last_prompt + last_reply + suffix(tools)
        message, tokens = self.script.pop(0)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        if tokens > body["max_tokens"]:
            tokens, finish, message = body["max_tokens"], "length", {**message, "tool_calls": []}
        self._last = (prompt, tokens, len(messages))
        return {
            "prompt_token_ids": [7] * prompt,
            "choices": [
                {"message": {"role": "assistant", **message}, "token_ids": [8] * tokens, "finish_reason": finish}
            ],
        }


class Notebook:
    def reset(self, **kwargs: Any) -> None:
        self.lines: list[str] = []

    def write(self, line: str) -> str:
        """Write a line.

        Args:
            line: The line.
        """
        self.lines.append(line)
        return f"{len(self.lines)} lines"

    def fail(self) -> str:
        """Always fails."""
        raise RuntimeError("the disk is full")


def _run(
    script: list[tuple[dict[str, Any], int]],
    *,
    max_iterations: int | None = None,
    budget: int = 1000,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[Episode, ScriptedModel, ToolReport]:
    rollout = Environments(Notebook).start({"prompt": "Take notes."})
    episode = Episode(rollout.environment, None, rollout.prompt)
    model = ScriptedModel(script)
    report = ToolReport()
    limits = ToolLoopLimits(max_iterations, budget, chat_template_kwargs or {})
    run_tool_loop(model, episode, rollout.toolbox, limits, suffix, report)
    return episode, model, report


def test_parallel_calls_run_in_order_and_every_result_goes_back() -> None:
    episode, model, report = _run(
        [
            reply(call("write", '{"line": "a"}', "c1"), call("write", '{"line": "b"}', "c2")),
            reply(content="Done."),
        ]
    )
    assert episode.environment.lines == ["a", "b"]
    assert [m for m in model.requests[1]["messages"] if m["role"] == "tool"] == [
        {"role": "tool", "tool_call_id": "c1", "name": "write", "content": "1 lines"},
        {"role": "tool", "tool_call_id": "c2", "name": "write", "content": "2 lines"},
    ]
    assert [m["role"] for m in episode.completion] == ["assistant", "tool", "tool", "assistant"]
    assert episode.parallel_calls == [2] and episode.tool_calls == 2 and report.failures == 0
    assert episode.stop_reason == "no_tool_call" and not episode.loop_exhausted
    assert [name for name, _ in report.latency_s] == ["write", "write"]
    assert {t["function"]["name"] for t in model.requests[0]["tools"]} == {"write", "fail"}
    assert model.requests[0]["return_token_ids"] is True


def test_a_raising_tool_and_an_unknown_name_are_failures_the_model_reads() -> None:
    episode, model, report = _run(
        [
            reply(call("fail", "{}", "c1"), call("erase", '{"line": "a"}', "c2")),
            reply(content="I could not."),
        ]
    )
    results = [m["content"] for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert results == ["{'error': 'the disk is full'}", "{'error': 'Tool erase not found.'}"]
    assert (episode.tool_calls, episode.tool_failures, episode.unknown_names) == (2, 2, 1)
    assert report.failures == 2 and report.calls == {"fail": 1, "erase": 1}


def test_max_tool_calling_iterations_caps_the_rounds_of_tool_calls() -> None:
    always_calls = [reply(call("write", '{"line": "x"}', f"c{i}")) for i in range(5)]
    episode, model, report = _run(always_calls, max_iterations=2)
    assert len(model.requests) == 3 and episode.environment.lines == ["x", "x"]  # the third reply's call never runs
    assert episode.stop_reason == "max_tool_calling_iterations" and episode.loop_exhausted
    assert episode.tool_calls == 2 and report.calls == {"write": 2}  # what the metrics count: the calls that ran
    episode, model, _ = _run(always_calls, max_iterations=0)
    assert len(model.requests) == 1 and episode.environment.lines == []


def test_max_completion_length_counts_every_model_and_tool_token_across_turns() -> None:
    # Prompt 20. Reply 1: 10 tokens + tool result "1 lines" (7 chars + 5 = 12): 22 used.
    # Reply 2 may take 60 - 22 = 38 and takes 30: 52 used; its result (12 more) would leave no room.
    episode, model, _ = _run(
        [
            reply(call("write", '{"line": "a"}', "c1")),
            reply(call("write", '{"line": "b"}', "c2"), tokens=30),
            reply(content="never asked"),
        ],
        budget=60,
    )
    assert [r["max_tokens"] for r in model.requests] == [60, 38]
    assert episode.completion_tokens == 52 and episode.stop_reason == "max_completion_length" and episode.loop_exhausted
    assert episode.environment.lines == ["a", "b"]  # the tool ran; its result is rolled back, never sent
    assert [m["role"] for m in episode.completion] == ["assistant", "tool", "assistant"]


def test_a_reply_cut_at_the_budget_ends_the_episode() -> None:
    episode, model, _ = _run([reply(call("write", '{"line": "a"}', "c1"), tokens=50)], budget=40)
    assert model.requests[0]["max_tokens"] == 40
    assert episode.completion_tokens == 40 and episode.stop_reason == "max_completion_length"
    assert episode.environment.lines == []


def test_the_proxys_budget_answer_ends_the_episode_and_is_not_a_model_turn() -> None:
    rollout = Environments(Notebook).start({"prompt": "Take notes."})
    episode = Episode(rollout.environment, None, rollout.prompt)
    model = ScriptedModel([reply(call("write", '{"line": "a"}', "c1"))])

    def budgeted(body: dict[str, Any]) -> dict[str, Any]:
        if model.requests:
            return {"choices": [{"message": {"role": "assistant", "content": "Step budget exhausted; stopping."}}]}
        return model(body)

    run_tool_loop(budgeted, episode, rollout.toolbox, ToolLoopLimits(None, 100), suffix, ToolReport())
    assert episode.stop_reason == "max_model_calls" and len(episode.completion) == 2


def test_a_timeout_ends_the_episode_as_timed_out() -> None:
    rollout = Environments(Notebook).start({"prompt": "Take notes."})
    episode = Episode(rollout.environment, None, rollout.prompt)
    model = ScriptedModel([reply(call("write", '{"line": "a"}', "c1"))])

    def slow(body: dict[str, Any]) -> dict[str, Any]:
        if model.requests:
            raise TimeoutError("the rollout's time is up")
        return model(body)

    with pytest.raises(TimeoutError):
        run_tool_loop(slow, episode, rollout.toolbox, ToolLoopLimits(None, 100), suffix, ToolReport())
    assert episode.stop_reason == "timeout" and episode.loop_exhausted


def test_chat_template_kwargs_go_with_every_call() -> None:
    _, model, _ = _run(
        [reply(call("write", '{"line": "a"}', "c1")), reply(content="ok")],
        chat_template_kwargs={"enable_thinking": False},
    )
    assert [r["chat_template_kwargs"] for r in model.requests] == [{"enable_thinking": False}] * 2
