"""Sessions: keys, per-session settings, capture state, journal recovery.

Contract: the API key an agent sends *is* its session id (``s`` + 24 hex, or a
caller-chosen id matching ``SESSION_ID_RE``). A session pins its engine, its
purpose (``train`` pins a ``SamplingPolicy``; ``eval`` passes sampling
through), a model-call budget and a max output length, and owns one
``CaptureGraph`` and one journal. ``SessionRegistry.recover()`` rebuilds every
session from its journal, so a restarted proxy serves the same traces.
"""

from __future__ import annotations

import contextlib
import hmac
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from proxy.capture_graph import CaptureGraph
from proxy.engine_client import Capture
from proxy.journal import SessionJournal, read_journal
from proxy.sampling_policy import SamplingPolicy

SESSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def mint_session_id() -> str:
    """A fresh random session id / agent API key."""
    return "s" + secrets.token_hex(12)


def keys_equal(given: str | None, expected: str) -> bool:
    """Constant-time key comparison."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True)
class SessionConfig:
    """What a session pins at creation."""

    purpose: str = "train"  # "train" | "eval"
    sampling: dict[str, Any] | None = None  # SamplingPolicy fields; train only
    max_model_calls: int | None = None
    max_output_tokens: int | None = None
    llm_url: str | None = None  # None: the proxy's default engine
    model: str | None = None  # served model name upstream; None: the engine's first model
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.purpose not in ("train", "eval"):
            raise ValueError("purpose must be 'train' or 'eval'")
        if self.purpose == "train":
            SamplingPolicy.from_dict(self.sampling)
        elif self.sampling is not None:
            raise ValueError("eval sessions pass the agent's sampling through; 'sampling' is for train sessions")
        for name in ("max_model_calls", "max_output_tokens"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{name} must be a positive integer")

    @property
    def policy(self) -> SamplingPolicy | None:
        return SamplingPolicy.from_dict(self.sampling) if self.purpose == "train" else None


@dataclass
class SessionStats:
    """Per-session counters, for ``GET /sessions/{id}`` and metrics."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    budget_refusals: int = 0
    created_at: float = field(default_factory=time.time)
    last_activity: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["last_activity"]
        out["idle_s"] = round(time.monotonic() - self.last_activity, 3)
        return out


class Session:
    """One agent session: settings, capture graph, journal and stats."""

    def __init__(self, session_id: str, config: SessionConfig, journal: SessionJournal, model: str) -> None:
        self.id = session_id
        self.config = config
        self.policy = config.policy
        self.model = model
        self.journal = journal
        self.graph = CaptureGraph()
        self.stats = SessionStats()
        self._requests: dict[str, dict[str, Any]] = {}  # node id -> its request (shared with the graph)
        self._in_flight = 0

    def budget_exhausted(self) -> bool:
        """True when the calls recorded plus those in flight (``call_slot``) reach ``max_model_calls``."""
        limit = self.config.max_model_calls
        return limit is not None and self.stats.calls + self._in_flight >= limit

    @contextlib.contextmanager
    def call_slot(self) -> Iterator[None]:
        """Hold one place in the call budget while an engine call is pending (the event loop's thread only)."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    def record(self, capture: Capture, request: dict[str, Any], response: dict[str, Any], metadata: dict) -> str:
        """Add one engine call to the journal, then to the graph; returns the node id.

        All or nothing: a call the graph rejects (``CaptureContractError``) is not journaled, and one
        whose journal write fails (``OSError``, e.g. a full disk) is not in the graph, so the trace
        holds a turn only if its journal record is on disk. The caller renders its reply first and
        sends it after this returns.
        """

        def journal(node_id: str, base: str | None, new_prompt_ids: list[int]) -> None:
            self.journal.append(
                {
                    "kind": "call",
                    "node_id": node_id,
                    "base": base,
                    "new_prompt_ids": new_prompt_ids,
                    "sampled_ids": capture.sampled_ids,
                    "logprobs": capture.logprobs,
                    "request": _request_delta(request, base, self._requests.get(base) if base else None),
                    "response": response,
                    "metadata": metadata,
                }
            )

        node_id = self.graph.add_call(
            capture.prompt_ids,
            capture.sampled_ids,
            capture.logprobs,
            request,
            response,
            metadata,
            before_commit=journal,
        )
        self._requests[node_id] = request
        self._count(capture)
        return node_id

    def _count(self, capture: Capture) -> None:
        self.stats.calls += 1
        self.stats.prompt_tokens += len(capture.prompt_ids)
        self.stats.completion_tokens += len(capture.sampled_ids)
        self.stats.last_activity = time.monotonic()

    def describe(self) -> dict[str, Any]:
        """JSON-ready view for the control plane."""
        return {"id": self.id, "model": self.model, "config": asdict(self.config), "stats": self.stats.as_dict()}


class SessionRegistry:
    """All live sessions of one proxy, backed by journals in ``journal_dir``."""

    def __init__(self, journal_dir: Path, *, fsync: bool = False) -> None:
        self.journal_dir = journal_dir
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(self._sessions.values())

    def get(self, session_id: str | None) -> Session | None:
        """The session whose id equals the key, or None (dict lookup on the hashed key)."""
        return self._sessions.get(session_id) if session_id else None

    def create(self, config: SessionConfig, model: str, session_id: str | None = None) -> Session:
        """Register a session; ``session_id`` None mints one."""
        session_id = session_id or mint_session_id()
        if not SESSION_ID_RE.fullmatch(session_id):
            raise ValueError("session id must match [A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
        if session_id in self._sessions:
            raise KeyError(f"session {session_id} exists")
        journal = SessionJournal(self.journal_dir / f"{session_id}.jsonl", fsync=self._fsync)
        journal.append({"kind": "session", "id": session_id, "model": model, "config": asdict(config)})
        session = Session(session_id, config, journal, model)
        self._sessions[session_id] = session
        return session

    def delete(self, session_id: str) -> bool:
        """Forget a session and remove its journal; False if unknown."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        session.journal.delete()
        return True

    def recover(self) -> int:
        """Rebuild sessions from journals on disk; returns how many."""
        for path in sorted(self.journal_dir.glob("*.jsonl")):
            records = read_journal(path)
            head = next(records, None)
            if head is None or head.get("kind") != "session" or head["id"] in self._sessions:
                continue
            config = SessionConfig(**head["config"])
            session = Session(head["id"], config, SessionJournal(path, fsync=self._fsync), head["model"])
            ends: dict[str, list[int]] = {}  # node id -> prompt + sampled ids
            for rec in records:
                base = rec["base"]
                prompt_ids = ends[base] + rec["new_prompt_ids"] if base is not None else rec["new_prompt_ids"]
                capture = Capture(prompt_ids, rec["sampled_ids"], rec["logprobs"])
                ends[rec["node_id"]] = prompt_ids + rec["sampled_ids"]
                request = _request_from_delta(rec["request"], session._requests)
                session.graph.add_call(
                    capture.prompt_ids,
                    capture.sampled_ids,
                    capture.logprobs,
                    request,
                    rec["response"],
                    rec["metadata"],
                    node_id=rec["node_id"],
                )
                session._requests[rec["node_id"]] = request
                session._count(capture)
            self._sessions[session.id] = session
        return len(self._sessions)

    def close(self) -> None:
        for session in self._sessions.values():
            session.journal.close()


def _request_delta(request: dict[str, Any], base_id: str | None, base: dict[str, Any] | None) -> dict[str, Any]:
    """The journal form of ``request``: only what is new relative to the base node's request.

    An agent resends its whole history each call, so journaling full requests
    grows with turns x history; here a call costs its new messages only.
    """
    messages = request["messages"]
    if base is None or messages[: len(base["messages"])] != base["messages"]:
        return {"base": None, "new_messages": messages, "tools": request["tools"]}
    delta: dict[str, Any] = {"base": base_id, "new_messages": messages[len(base["messages"]) :]}
    if request["tools"] != base["tools"]:
        delta["tools"] = request["tools"]
    return delta


def _request_from_delta(delta: dict[str, Any], requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Invert ``_request_delta`` given the requests of earlier nodes."""
    base = requests[delta["base"]] if delta["base"] is not None else None
    if base is None:
        return {"messages": delta["new_messages"], "tools": delta["tools"]}
    return {"messages": base["messages"] + delta["new_messages"], "tools": delta.get("tools", base["tools"])}
