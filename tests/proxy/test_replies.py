"""The agent's reply and the trace agree, whatever goes wrong: errors after a stream opened stay in the stream,
deep nesting is refused at the door, a turn is recorded iff its reply is sent, malformed input is a 4xx."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from proxy.capture_graph import CaptureGraph
from proxy.engine_client import Capture
from proxy.sessions import SessionConfig, SessionRegistry


def _capture() -> Capture:
    return Capture([1, 2, 3], [4, 5], [-0.5, -0.25])


def test_session_record_writes_the_journal_before_the_graph(tmp_path: Path) -> None:
    registry = SessionRegistry(tmp_path)
    session = registry.create(SessionConfig(purpose="eval"), "m")
    request = {"messages": [{"role": "user", "content": "hi"}], "tools": []}

    def disk_full(record: dict[str, Any]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    session.journal.append = disk_full
    with pytest.raises(OSError):
        session.record(_capture(), request, {}, {})
    assert len(session.graph) == 0 and session.stats.calls == 0
    del session.journal.append
    node_id = session.record(_capture(), request, {}, {})
    assert len(session.graph) == 1 and session.stats.calls == 1
    registry.close()
    recovered = SessionRegistry(tmp_path)
    recovered.recover()
    assert [t.node_id for t in recovered.get(session.id).graph.to_training_trace().turns] == [node_id]
    recovered.close()


def test_before_commit_sees_the_prompt_delta_and_can_veto_the_call() -> None:
    graph = CaptureGraph()
    root = graph.add_call([1, 2], [3], [-0.1])
    seen: list[tuple[str, str | None, list[int]]] = []

    def veto(node_id: str, parent_id: str | None, new_ids: list[int]) -> None:
        seen.append((node_id, parent_id, list(new_ids)))
        raise OSError("no")

    with pytest.raises(OSError):
        graph.add_call([1, 2, 3, 7], [8], [-0.2], before_commit=veto)
    assert len(graph) == 1 and seen[0][1:] == (root, [7])
    child = graph.add_call([1, 2, 3, 7], [8], [-0.2], before_commit=lambda *delta: seen.append(delta))
    assert seen[1] == (child, root, [7]) and graph.prompt_delta(child) == (root, [7])
