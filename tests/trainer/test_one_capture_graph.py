"""One capture graph: the proxy builds it; the trainer reads its links back and never builds a second.

A session of the real proxy (in front of the fake vLLM-like engine) with a multi-turn tool loop, an
auxiliary toolless call and a rewritten history (a second root). With ``CaptureGraph.add_call``
made to fail, the trainer's path from trace to rows still works, and its sequences are exactly
the ones the proxy exports at ``/sessions/{id}/sequences``. A trace without links (another
producer's) is still rebuilt, to the same sequences.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness_grpo.rows import RowStats, rollout_rows
from proxy.capture_graph import AGENT, AUXILIARY, CaptureGraph, sequences_from_trace
from proxy.trace import TrainingTrace
from tests.proxy.proxy_stack import Stack, agent_turns, run_stack


def _session(tmp_path: Path) -> tuple[TrainingTrace, list[dict[str, Any]]]:
    captured: dict[str, Any] = {}

    async def run(stack: Stack) -> None:
        session = await stack.create_session(purpose="train", sampling={"temperature": 1.0})
        await agent_turns(stack, session.api_key, 6)
        status, _ = await stack.chat(session.api_key, [{"role": "user", "content": "a title"}], return_token_ids=True)
        assert status == 200
        await agent_turns(stack, session.api_key, 2, marker="the history, compacted")  # a rewrite: a new root
        captured["trace"] = TrainingTrace.model_validate(await stack.trace(session.session_id))
        captured["sequences"] = await stack.sequences(session.session_id)

    run_stack(run, tmp_path / "journal")
    return captured["trace"], captured["sequences"]


def _plain(sequences: list[Any]) -> list[tuple[Any, ...]]:
    return [(s.token_ids, s.loss_mask, s.logprobs, s.node_ids, s.role) for s in sequences]


def test_our_proxys_trace_becomes_rows_without_a_second_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace, exported = _session(tmp_path)
    assert len(trace.turns) == 9

    def second_graph(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the trainer built a second capture graph")

    monkeypatch.setattr(CaptureGraph, "add_call", second_graph)
    sequences = sequences_from_trace(trace)
    assert _plain(sequences) == [
        (s["token_ids"], s["loss_mask"], s["logprobs"], s["node_ids"], s["role"]) for s in exported
    ]
    assert {s.role for s in sequences} == {AGENT, AUXILIARY}
    assert sum(s.role == AGENT for s in sequences) == 2  # the tool loop and its rewritten continuation
    stats = RowStats()
    rows = rollout_rows(sequences, 1.0, policy_version=0, rollout_id="r", group_id="g", stats=stats)
    assert len(rows) == 2 and stats.excluded_role == 1
    trained = sum(sum(t.loss_mask) for t in trace.turns if t.metadata["role"] == AGENT)
    assert sum(row.n_trainable for row in rows) == trained  # every agent token trained once


def test_a_trace_without_links_is_rebuilt_to_the_same_sequences(tmp_path: Path) -> None:
    trace, _ = _session(tmp_path)
    foreign = TrainingTrace.model_validate(
        {
            "turns": [
                {**t.model_dump(), "metadata": {k: v for k, v in t.metadata.items() if k not in ("parent_id", "role")}}
                for t in trace.turns
            ]
        }
    )
    assert _plain(sequences_from_trace(foreign)) == _plain(sequences_from_trace(trace))


def test_a_link_that_is_not_a_token_prefix_is_not_trusted(tmp_path: Path) -> None:
    trace, _ = _session(tmp_path)
    child = next(t for t in trace.turns if t.metadata["parent_id"] is not None)
    other_root = next(
        t for t in trace.turns if t.metadata["parent_id"] is None and t.node_id != child.metadata["parent_id"]
    )
    lying = TrainingTrace.model_validate(
        {
            "turns": [
                {**t.model_dump(), "metadata": {**t.metadata, "parent_id": other_root.node_id}}
                if t.node_id == child.node_id
                else t.model_dump()
                for t in trace.turns
            ]
        }
    )
    assert _plain(sequences_from_trace(lying)) == _plain(sequences_from_trace(trace))  # rebuilt by exact prefix
