"""Sessions: keys, per-session settings, capture state, journal recovery.

Contract: a session has a name and a secret. Its id (``s`` + 24 hex, or a
caller-chosen name matching ``SESSION_ID_RE``) names it on the control plane
and is its journal's file name; it is not a secret. Its API key, what its
agent sends, is minted here (``mint_api_key``: 256 random bits), returned once
by ``create`` and never stored, logged or journaled: the registry keeps only
its SHA-256 (``key_hash``), looks sessions up by that hash, and writes it into
the journal's session record, so a restarted proxy accepts the same keys. The
journal directory (and ``quarantine/``) is kept at mode 0o700 and journals at
0o600, checked when the registry opens the directory and when it recovers a
journal: a directory owned by another user is refused. A session pins its engine, its
purpose (``train`` pins a ``SamplingPolicy``; ``eval`` passes sampling
through), a model-call budget and a max output length, and owns one
``CaptureGraph`` and one journal. ``SessionRegistry.recover()`` rebuilds every
session from its journal, so a restarted proxy serves the same traces; a file
it can't rebuild a session from is moved to ``quarantine/`` beside the
journals, never a reason not to start.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from proxy.bridge import REASONING_MODES, BridgeIndex, History
from proxy.capture_graph import CaptureGraph
from proxy.dialects.base import MessageMemo
from proxy.engine_client import Capture, engine_base_url
from proxy.journal import JournalError, JournalFiles, SessionJournal, cut_torn_tail, quarantine, read_journal
from proxy.sampling_policy import SamplingPolicy

log = logging.getLogger("proxy")

QUARANTINE_DIR = "quarantine"  # under the journal directory: journals recovery could not read
SESSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
KEY_HASH_RE = re.compile(r"[0-9a-f]{64}")


def mint_session_id() -> str:
    """A fresh random session id (a name, not a secret)."""
    return "s" + secrets.token_hex(12)


def mint_api_key() -> str:
    """A fresh agent API key: 256 random bits, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def key_hash(api_key: str) -> str:
    """The SHA-256 of an API key, hex: the only form in which a key is kept."""
    return hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).hexdigest()


def keys_equal(given: str | None, expected: str) -> bool:
    """Constant-time key comparison."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def make_private(path: Path, mode: int) -> None:
    """Take from ``path`` any permission bit ``mode`` lacks; ``PermissionError`` if another user owns it
    (its owner could read or replace what is in it)."""
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is owned by uid {st.st_uid}, not by this proxy's user")
    had = stat.S_IMODE(st.st_mode)
    if had & ~mode:
        log.warning("%s had mode %03o; set to %03o (journals are private to the proxy's user)", path, had, had & mode)
        os.chmod(path, had & mode)


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
    bridge: bool = True  # prompt re-sent sampled turns with their sampled ids where the engine can (proxy.bridge)
    bridge_reasoning: str = "fork"  # past reasoning the template drops: "fork" there, or "keep" the sampled ids

    def __post_init__(self) -> None:
        if self.purpose not in ("train", "eval"):
            raise ValueError("purpose must be 'train' or 'eval'")
        if type(self.bridge) is not bool:
            raise ValueError("bridge must be a boolean")
        if self.bridge_reasoning not in REASONING_MODES:
            raise ValueError(f"bridge_reasoning must be one of {list(REASONING_MODES)}")
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

    def __init__(
        self, session_id: str, config: SessionConfig, journal: SessionJournal, model: str, key_hash: str
    ) -> None:
        self.id = session_id
        self.key_hash = key_hash  # SHA-256 of the agent's API key; the key itself is never kept
        self.config = config
        self.policy = config.policy
        self.model = model
        self.journal = journal
        self.graph = CaptureGraph()
        self.bridge = BridgeIndex()
        self.message_memo = MessageMemo()  # the dialect's conversions of the last request's messages
        self.stats = SessionStats()
        self._requests: dict[str, dict[str, Any]] = {}  # node id -> its request (shared with the graph)
        self._metadata: dict[str, Any] | None = None  # the last turn's, shared by the next turns while equal
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

    def record(
        self,
        capture: Capture,
        request: dict[str, Any],
        response: dict[str, Any],
        metadata: dict,
        *,
        extends: str | None = None,
    ) -> str:
        """Add one engine call to the journal, then to the graph; returns the node id (``extends``: a node whose
        ids the call's prompt was checked to start with, see ``CaptureGraph.add_call``).

        All or nothing: a call the graph rejects (``CaptureContractError``) is not journaled, and one
        whose journal write fails (``OSError``, e.g. a full disk) is not in the graph, so the trace
        holds a turn only if its journal record is on disk. The caller renders its reply first and
        sends it after this returns. ``request`` is ``{"messages": [...], "tools": [...]}``; the turn
        keeps the base node's message objects and tools list where they are equal, and the previous
        turn's metadata dict when equal, so a session holds each distinct message once.
        """
        kept = {"messages": request["messages"], "tools": request["tools"]}  # the graph's; filled in once placed
        if metadata == self._metadata:
            metadata = self._metadata
        self._metadata = metadata

        def journal(node_id: str, base: str | None, new_prompt_ids: list[int]) -> None:
            shared, delta = _share_request(request, base, self._requests.get(base) if base else None)
            self.journal.append(
                {
                    "kind": "call",
                    "node_id": node_id,
                    "base": base,
                    "new_prompt_ids": new_prompt_ids,
                    "sampled_ids": capture.sampled_ids,
                    "logprobs": capture.logprobs,
                    "request": delta,
                    "response": response,
                    "metadata": metadata,
                }
            )
            kept.update(shared)

        node_id = self.graph.add_call(
            capture.prompt_ids,
            capture.sampled_ids,
            capture.logprobs,
            kept,
            response,
            metadata,
            before_commit=journal,
            extends=extends,
        )
        self._requests[node_id] = kept
        self._count(capture)
        return node_id

    def _count(self, capture: Capture) -> None:
        self.stats.calls += 1
        self.stats.prompt_tokens += len(capture.prompt_ids)
        self.stats.completion_tokens += len(capture.sampled_ids)
        self.stats.last_activity = time.monotonic()

    def describe(self) -> dict[str, Any]:
        """JSON-ready view for the control plane."""
        stats = {**self.stats.as_dict(), "bridge": self.bridge.stats.as_dict()}
        return {"id": self.id, "model": self.model, "config": asdict(self.config), "stats": stats}


class SessionRegistry:
    """All live sessions of one proxy, backed by journals in ``journal_dir``.

    Journals share ``max_open_journals`` descriptors (``JournalFiles``), so the number of sessions
    is not bounded by the open-file limit. ``recover()`` moves every ``*.jsonl`` file it can't
    rebuild a session from into ``journal_dir/quarantine/`` (listed in ``quarantined``) and
    recovers the rest; a torn last record (a crash mid-write) loses only that record.
    ``PermissionError`` at construction: ``journal_dir`` belongs to another user.
    """

    def __init__(self, journal_dir: Path, *, fsync: bool = False, max_open_journals: int = 128) -> None:
        self.journal_dir = journal_dir
        self.journal_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        make_private(journal_dir, 0o700)
        self.quarantine_dir = journal_dir / QUARANTINE_DIR
        self.quarantined: list[tuple[str, str]] = []  # (file name, why) of journals recovery set aside
        self._files = JournalFiles(max_open_journals, fsync=fsync)
        self._sessions: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}  # key_hash -> session
        self._engines: Counter[str | None] = Counter()  # engine base URL (None: the default) -> sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(self._sessions.values())

    def get(self, session_id: str | None) -> Session | None:
        """The session named ``session_id`` (control plane), or None."""
        return self._sessions.get(session_id) if session_id else None

    def by_key(self, api_key: str | None) -> Session | None:
        """The session whose API key is ``api_key`` (agent plane), or None; looked up by the key's hash."""
        return self._by_key.get(key_hash(api_key)) if api_key else None

    def uses_engine(self, base_url: str) -> bool:
        """Whether a live session pinned the engine at ``base_url`` (``engine_base_url`` form)."""
        return self._engines[base_url] > 0

    def create(self, config: SessionConfig, model: str, session_id: str | None = None) -> tuple[Session, str]:
        """Register a session; ``session_id`` None mints one. Returns the session and its API key, which
        exists nowhere else: the caller hands it to the agent.

        ``KeyError``: the id is taken (live, or a journal of that name on disk); ``ValueError``: a bad
        id or settings that can't be journaled; ``OSError``: the journal could not be written. On
        any failure nothing is registered and nothing is left on disk.
        """
        session_id = session_id or mint_session_id()
        if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
            raise ValueError("session id must be a string matching [A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
        if session_id in self._sessions:
            raise KeyError(f"session {session_id} exists")
        api_key = mint_api_key()
        hashed = key_hash(api_key)
        header = {"kind": "session", "id": session_id, "key_sha256": hashed, "model": model, "config": asdict(config)}
        try:
            journal = self._files.create(self.journal_dir / f"{session_id}.jsonl", header)
        except FileExistsError:
            raise KeyError(f"session {session_id} exists (its journal is on disk)") from None
        except TypeError as exc:  # orjson: nested too deep, an integer past 64 bits, ...
            raise ValueError(f"session settings can't be journaled: {exc}") from None
        return self._add(Session(session_id, config, journal, model, hashed)), api_key

    def _add(self, session: Session) -> Session:
        self._sessions[session.id] = session
        self._by_key[session.key_hash] = session
        self._engines[_engine_key(session.config.llm_url)] += 1
        return session

    def delete(self, session_id: str) -> bool:
        """Forget a session and remove its journal; False if unknown."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        del self._by_key[session.key_hash]
        key = _engine_key(session.config.llm_url)
        self._engines[key] -= 1
        if not self._engines[key]:
            del self._engines[key]
        session.journal.delete()
        return True

    def recover(self) -> int:
        """Rebuild sessions from journals on disk, quarantining what can't be read; returns how many."""
        for path in sorted(self.journal_dir.glob("*.jsonl")):
            try:
                contents = read_journal(path)
                make_private(path, 0o600)
                session = self._replay(path, contents.records)
            except Exception as exc:  # whatever it is, it is not a journal this proxy can serve
                self._quarantine(path, f"{type(exc).__name__}: {exc}")
                continue
            if contents.torn:
                lost = contents.size - contents.complete_size
                log.warning("journal %s: dropped a torn last record (%d bytes; a crash mid-write)", path.name, lost)
                cut_torn_tail(path, contents)
            self._add(session)
        return len(self._sessions)

    def _quarantine(self, path: Path, why: str) -> None:
        try:
            if self.quarantine_dir.exists():
                make_private(self.quarantine_dir, 0o700)
            moved = quarantine(path, self.quarantine_dir)
        except OSError as exc:
            log.error("journal %s can't be recovered (%s) nor quarantined (%s); skipped", path.name, why, exc)
        else:
            log.error("journal %s can't be recovered (%s); moved to %s", path.name, why, moved)
        self.quarantined.append((path.name, why))

    def _replay(self, path: Path, records: list[dict[str, Any]]) -> Session:
        """The session a journal's records describe; raises on anything that doesn't fit."""
        if not records:
            raise JournalError("no complete record")
        head = records[0]
        if head.get("kind") != "session":
            raise JournalError("the first record is not a session record")
        session_id = head.get("id")
        if session_id != path.stem or session_id in self._sessions:
            raise JournalError(f"session id {session_id!r} does not match the file name")
        if not isinstance(head.get("model"), str) or not isinstance(head.get("config"), dict):
            raise JournalError("the session record lacks a model or a config")
        hashed = head.get("key_sha256")
        if not isinstance(hashed, str) or not KEY_HASH_RE.fullmatch(hashed):
            raise JournalError("the session record holds no API key hash (no agent could reach the session)")
        config = SessionConfig(**head["config"])
        session = Session(session_id, config, self._files.journal(path), head["model"], hashed)
        ends: dict[str, list[int]] = {}  # node id -> prompt + sampled ids
        history: History | None = None  # the previous record's: each record hashes only its new messages
        for rec in records[1:]:
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
            if not config.bridge:
                continue
            history = History(
                request["messages"], request["tools"], rec["metadata"].get("chat_template_kwargs"), extends=history
            )
            session.bridge.add(rec["node_id"], history, rec["response"], rec["sampled_ids"], rec["metadata"])
        return session

    def close(self) -> None:
        """Close the journals' descriptors."""
        self._files.close_all()


def _engine_key(llm_url: str | None) -> str | None:
    return engine_base_url(llm_url) if llm_url else None


def _share_request(
    request: dict[str, Any], base_id: str | None, base: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(kept, delta)``: ``request`` reusing the base node's message objects and tools list where equal, and
    its journal form, only what is new relative to the base node's request.

    An agent resends its whole history each call, so keeping or journaling full requests grows with
    turns x history; here a call costs its new messages only.
    """
    messages, tools = request["messages"], request["tools"]
    n = len(base["messages"]) if base is not None else 0
    if base is None or messages[:n] != base["messages"]:
        return request, {"base": None, "new_messages": messages, "tools": tools}
    new = messages[n:]
    delta: dict[str, Any] = {"base": base_id, "new_messages": new}
    if tools == base["tools"]:
        tools = base["tools"]
    else:
        delta["tools"] = tools
    return {"messages": base["messages"] + new, "tools": tools}, delta


def _request_from_delta(delta: dict[str, Any], requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Invert ``_share_request``'s delta given the requests of earlier nodes (sharing their objects too)."""
    base = requests[delta["base"]] if delta["base"] is not None else None
    if base is None:
        return {"messages": delta["new_messages"], "tools": delta["tools"]}
    return {"messages": base["messages"] + delta["new_messages"], "tools": delta.get("tools", base["tools"])}
