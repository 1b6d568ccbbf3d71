"""The agent's reply and the trace agree, whatever goes wrong: errors after a stream opened stay in the stream,
deep nesting is refused at the door, a turn is recorded iff its reply is sent, malformed input is a 4xx."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.capture_graph import CaptureGraph
from proxy.engine_client import Capture
from proxy.json_depth import MAX_REQUEST_DEPTH, NestingError, dumps_bounded
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


def test_dumps_bounded_is_orjson_with_an_exact_depth_bound() -> None:
    value: Any = {"a": [1, "x", None, {"b": 2.5}]}
    assert dumps_bounded(value) == orjson.dumps(value)
    assert dumps_bounded(7, 1) == b"7" and dumps_bounded([], 1) == b"[]"
    with pytest.raises(NestingError):
        dumps_bounded([[]], 1)
    nested: Any = []
    for _ in range(MAX_REQUEST_DEPTH - 1):
        nested = [nested]
    assert dumps_bounded(nested) == orjson.dumps(nested)
    with pytest.raises(NestingError):
        dumps_bounded([nested])
