"""The capture graph: every engine call of one session, linked by exact token prefix.

    node      one engine call: the prompt ids the engine tokenised, the ids it sampled, their logprobs
    parent    the node whose prompt + sampled ids form the LONGEST exact token prefix of this prompt
              (and whose prompt is strictly shorter); ties go to the earliest arrival
    root      a call that extends nothing: the first call, a subagent, a title generator, or a
              rewritten history (compaction, a swapped system prompt, a re-rendered template).
              There is no fuzzy matching: a rewrite is a new root, never a stitched trajectory
    path      root -> leaf; one training sequence

Arrival order does not decide the structure: a late ancestor re-adopts the nodes that arrived before
it, so every node ends with the best parent over all nodes (longest end, then earliest arrival).

Masks. Prompt spans (a root's prompt, a child's interstitial tool results and scaffolding) are
context: mask 0, logprob 0.0. A node's sampled ids are trainable (mask 1) only when the engine
returned their logprobs; a call without logprobs (`None`) is kept as context. Logprobs that do not
align, and ids that are not non-negative ints, are rejected at `add_call` (`CaptureContractError`).

Roles label paths, they do not filter them. A childless node is `discarded` when a sibling of it
continued (siblings: children of one parent, or roots with identical prompts); if every sibling is
terminal, all are kept. A path ending in a discarded node is `discarded`. If any live call sent a
tool manifest (non-empty `request["tools"]`), paths with a tool call are `agent` and toolless ones
`auxiliary`; otherwise every live path is `agent`.

Supervised once. Paths share prefixes, so sequences are ordered canonically (agent, auxiliary,
discarded; longer first; then by token ids) and each node is trained only in the first sequence
that contains it; later sequences carry it as context. The node's role is that sequence's role.
Masks are a property of the node, so sequences cannot disagree about one.

Complexity. Per `add_call` with a prompt of L tokens, N of them new (interstitial + sampled; all of
them for a root), and a parent at depth d (d < L: each level adds at least one prompt token):
  * parent lookup probes a dict keyed by (end length, hash of the last 32 end ids) at the distinct
    node-end lengths <= L, longest first; the first candidate that verifies exactly wins. An
    append-only chat needs one probe. A new root needs at most min(#nodes, L) probes of O(32) each;
    once a candidate fails verification (re-rendered histories repeat their recent turns, hence
    their tails), one O(L) pass computes the prompt's prefix CRCs at every candidate length and
    they screen the rest, so at most one false candidate is compared per call. Verification is
    exact: O(L) C-level list comparison and O(d) Python steps;
  * validation, storage and the node's end CRC are O(N): a node stores only its new tokens;
  * re-adoption is one O(log n) bisect when calls arrive in order. Out of order, each node with a
    longer prompt gets an O(1) length filter, an O(32) tail comparison, and an O(L) exact check
    only if the tails agree.
So ingestion is O(total input tokens) and memory O(distinct tokens); the one super-linear case is
re-rendered histories arriving out of order (tails agree, prefixes differ). Exports are
O(nodes + output): `training_sequences` writes each path once; `to_training_trace` writes each
node's full prompt once (the schema repeats the prompt on every turn, so its size is the sum of
prompt lengths); `trace_json` serialises each token segment and message once and copies bytes.

Thread safety: `add_call` and the exports' O(nodes) snapshot share a lock, so an export may run in a
worker thread while the event loop keeps adding calls.
"""

from __future__ import annotations

import random
import threading
import zlib
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import orjson

from proxy.trace import (
    CaptureContractError,
    TrainingTrace,
    TrainingTurn,
    Violation,
    logprob_violations,
    token_id_violations,
)

AGENT, AUXILIARY, DISCARDED = "agent", "auxiliary", "discarded"
_ROLE_RANK = {AGENT: 0, AUXILIARY: 1, DISCARDED: 2}
_RESERVED_METADATA = frozenset({"index", "parent_id", "role", "node_id"})
_TAIL = 32  # tokens hashed into a node-end fingerprint
_NODE_IDS = random.Random()  # seeded from the OS once; a node id needs uniqueness in its graph, not secrecy


@dataclass(slots=True, eq=False)
class _Node:
    node_id: str
    index: int
    prompt_len: int
    context: list[int]  # prompt ids after the parent's end; the whole prompt for a root
    sampled: list[int]
    logprobs: list[float] | None
    request: dict[str, Any]
    response: dict[str, Any]
    metadata: dict[str, Any]
    parent: _Node | None
    end_crc: int | None  # CRC-32 of prompt + sampled packed as uint64; None if an id does not fit

    @property
    def end_len(self) -> int:
        return self.prompt_len + len(self.sampled)


_Path = tuple[list[tuple[_Node, list[int]]], str]  # (root-to-leaf [(node, its new prompt ids)], role)


@dataclass(slots=True)
class TrainingSequence:
    """One root-to-leaf path: all its ids, mask and behaviour logprobs (0.0 where masked)."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    node_ids: list[str]
    role: str


def _prefix_key(tokens: list[int], n: int) -> tuple[int, int]:
    """Fingerprint of `tokens[:n]`: its length and a hash of its last `_TAIL` ids."""
    return n, hash(tuple(tokens[max(0, n - _TAIL) : n]))


def _end_key(prompt: list[int], sampled: list[int]) -> tuple[int, int]:
    """`_prefix_key` of `prompt + sampled` at its full length, without concatenating the prompt."""
    return len(prompt) + len(sampled), hash(tuple((prompt[-_TAIL:] + sampled)[-_TAIL:]))


def _crc(tokens: list[int], start: int | None) -> int | None:
    """CRC-32 of `tokens` packed as uint64, continuing from `start`; None if `start` is None or an id overflows."""
    if start is None:
        return None
    try:
        return zlib.crc32(array("Q", tokens), start)
    except OverflowError:
        return None


def _prefix_crcs(tokens: list[int], lengths: list[int]) -> dict[int, int]:
    """`_crc(tokens[:n], 0)` for each n of the ascending `lengths`, in one pass ({} if an id is too big)."""
    try:
        packed = memoryview(array("Q", tokens[: lengths[-1]]))
    except OverflowError:
        return {}
    out, crc, previous = {}, 0, 0
    for n in lengths:
        crc = out[n] = zlib.crc32(packed[previous:n], crc)
        previous = n
    return out


def _is_prefix(node: _Node, tokens: list[int]) -> bool:
    """Whether `node`'s prompt + sampled ids are exactly `tokens[:node.end_len]`."""
    if len(tokens) < node.end_len:
        return False
    current: _Node | None = node
    while current is not None:
        start = current.prompt_len
        if tokens[start : start + len(current.sampled)] != current.sampled:
            return False
        if tokens[start - len(current.context) : start] != current.context:
            return False
        current = current.parent
    return True


def _check_call(
    prompt_ids: list[int], sampled_ids: list[int], logprobs: list[float] | None, dicts: dict[str, Any]
) -> list[float] | None:
    """Boundary checks that do not need the graph; returns the logprobs as floats."""
    problems: list[Violation] = []
    if not isinstance(prompt_ids, list) or not prompt_ids:
        problems.append(Violation("no_prompt_ids", "prompt_ids", "the prompt is empty or not a list"))
    if not isinstance(sampled_ids, list):
        problems.append(Violation("invalid_token_id", "sampled_ids", "not a list"))
    else:
        problems += token_id_violations(sampled_ids, "sampled_ids")
        if logprobs is not None and not isinstance(logprobs, list):
            problems.append(Violation("invalid_logprob", "sampled_logprobs", "not a list or None"))
        elif logprobs is not None:
            problems += logprob_violations(logprobs, len(sampled_ids), "sampled_logprobs")
    for name, value in dicts.items():
        if not isinstance(value, dict) or not all(type(key) is str for key in value):
            problems.append(Violation("invalid_field", name, "expected a dict with str keys"))
    metadata = dicts["metadata"]
    if isinstance(metadata, dict) and not _RESERVED_METADATA.isdisjoint(metadata):
        keys = sorted(_RESERVED_METADATA.intersection(metadata))
        problems.append(Violation("reserved_metadata", "metadata", f"keys {keys} are set by the graph"))
    if problems:
        raise CaptureContractError(problems)
    if logprobs is not None and not set(map(type, logprobs)) <= {float}:
        return list(map(float, logprobs))
    return logprobs


class CaptureGraph:
    """All engine calls of one session, linked by exact token prefix (see the module docstring)."""

    def __init__(self) -> None:
        self._nodes: list[_Node] = []  # arrival order
        self._by_id: dict[str, _Node] = {}
        self._by_end: dict[tuple[int, int], list[_Node]] = {}  # (end length, tail hash) -> nodes
        self._end_lengths: list[int] = []  # sorted, distinct
        self._prompt_lens: list[tuple[int, int]] = []  # sorted (prompt length, index)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._nodes)

    def add_call(
        self,
        prompt_ids: list[int],
        sampled_ids: list[int],
        sampled_logprobs: list[float] | None,
        request: dict[str, Any] | None = None,
        response: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        *,
        node_id: str | None = None,
        before_commit: Callable[[str, str | None, list[int]], None] | None = None,
        extends: str | None = None,
    ) -> str:
        """Record one engine call and return its node id (12 hex characters unless `node_id` is given).

        `before_commit(node_id, parent_id, new_prompt_ids)` (the node's `prompt_delta`), when given, runs
        once the call is validated and placed but before the graph changes: if it raises, nothing is
        added. A journal writes there, so a call is in the graph only if it is on disk.
        The graph keeps references to the lists and dicts passed in; callers must not mutate them.
        Raises `CaptureContractError` (nothing is recorded) for an empty prompt, ids that are not
        non-negative ints, logprobs that are not finite, non-positive and aligned with
        `sampled_ids`, a request/response/metadata that is not a dict with str keys, metadata keys
        the graph sets (`index`, `parent_id`, `role`, `node_id`), or a reused `node_id`. Prompt ids
        inside the parent's prefix are checked by equality with the parent's already-validated ids,
        except for `extends`: a node the caller found `prompt_ids` to start with (`self.extends`), which
        is not compared again when it is a parent candidate (a node's ids never change).
        """
        request = {} if request is None else request
        response = {} if response is None else response
        metadata = {} if metadata is None else metadata
        logprobs = _check_call(
            prompt_ids, sampled_ids, sampled_logprobs, {"request": request, "response": response, "metadata": metadata}
        )
        with self._lock:
            if node_id is None:
                node_id = f"{_NODE_IDS.getrandbits(48):012x}"
                while node_id in self._by_id:
                    node_id = f"{_NODE_IDS.getrandbits(48):012x}"
            elif not isinstance(node_id, str) or not node_id or node_id in self._by_id:
                raise CaptureContractError([Violation("invalid_node_id", "node_id", f"{node_id!r} is empty or used")])
            try:
                parent = self._find_parent(prompt_ids, self._by_id.get(extends) if extends else None)
            except TypeError:  # ids that cannot be hashed or packed; reported by the validation below
                parent = None
            start = parent.end_len if parent is not None else 0
            context = prompt_ids[start:] if start else prompt_ids
            problems = token_id_violations(context, "prompt_ids", offset=start)
            if problems:
                raise CaptureContractError(problems)
            if before_commit is not None:
                before_commit(node_id, parent.node_id if parent is not None else None, context)
            end_crc = _crc(sampled_ids, _crc(context, parent.end_crc if parent is not None else 0))
            node = _Node(
                node_id, len(self._nodes), len(prompt_ids), context, sampled_ids, logprobs,
                request, response, metadata, parent, end_crc,
            )  # fmt: skip
            self._adopt_orphans(node, prompt_ids)
            self._nodes.append(node)
            self._by_id[node_id] = node
            end_len = node.end_len
            self._by_end.setdefault(_end_key(prompt_ids, sampled_ids), []).append(node)
            index = bisect_left(self._end_lengths, end_len)
            if index == len(self._end_lengths) or self._end_lengths[index] != end_len:
                self._end_lengths.insert(index, end_len)
            insort(self._prompt_lens, (node.prompt_len, node.index))
        return node_id

    def _find_parent(self, prompt: list[int], known: _Node | None = None) -> _Node | None:
        """Longest exact node-end prefix of `prompt` from a strictly shorter prompt; earliest on ties.

        Candidates come from the tail fingerprint (`known`: one verified already). Once one fails exact
        verification (histories re-rendered with the same recent turns share tails), the prompt's prefix
        CRCs at all shorter candidate lengths are computed in one pass and screen the remaining candidates.
        """
        n_prompt = len(prompt)
        lengths = self._end_lengths
        crcs: dict[int, int] | None = None
        for i in range(bisect_right(lengths, n_prompt) - 1, -1, -1):
            n = lengths[i]
            for node in self._by_end.get(_prefix_key(prompt, n), ()):
                if node.prompt_len >= n_prompt:
                    continue
                if crcs and node.end_crc is not None and crcs[n] != node.end_crc:
                    continue
                if node is known or _is_prefix(node, prompt):
                    return node
                if crcs is None:
                    crcs = _prefix_crcs(prompt, lengths[: i + 1])
        return None

    def _adopt_orphans(self, node: _Node, prompt: list[int]) -> None:
        """Re-parent existing nodes whose best parent is `node` (they arrived before it)."""
        end_len = node.end_len
        first = bisect_left(self._prompt_lens, (max(end_len, node.prompt_len + 1), -1))
        if first == len(self._prompt_lens):
            return
        end = prompt + node.sampled
        for _, index in self._prompt_lens[first:]:
            other = self._nodes[index]
            parent = other.parent
            start = parent.end_len if parent is not None else 0
            if start >= end_len:  # its parent is as long (and earlier) or longer
                continue
            cut = end_len - start
            if other.context[max(0, cut - _TAIL) : cut] != end[max(start, end_len - _TAIL) :]:
                continue
            if other.context[:cut] == end[start:] and (parent is None or _is_prefix(parent, end)):
                other.parent = node
                other.context = other.context[cut:]

    def prompt_delta(self, node_id: str) -> tuple[str | None, list[int]]:
        """``(parent_id, new ids)``: the node's prompt is its parent's prompt + sampled ids, then these.

        A root has parent None and its whole prompt as new ids. Journals store this instead of the
        whole prompt, so a session's journal grows with the tokens it received, not turns x tokens.
        """
        with self._lock:
            node = self._by_id[node_id]
            return (node.parent.node_id if node.parent is not None else None), node.context

    def extends(self, node_id: str, tokens: list[int]) -> bool:
        """Whether `tokens` start with the node's prompt ids followed by its sampled ids."""
        with self._lock:
            return _is_prefix(self._by_id[node_id], tokens)

    def prompt_ids(self, node_id: str) -> list[int]:
        """The node's prompt ids (rebuilt from the segments along its path)."""
        with self._lock:
            prompt_len = self._by_id[node_id].prompt_len
        return self.end_ids(node_id)[:prompt_len]

    def end_ids(self, node_id: str) -> list[int]:
        """The node's prompt ids followed by its sampled ids (rebuilt from the segments along its path)."""
        with self._lock:
            segments = []
            node: _Node | None = self._by_id[node_id]
            while node is not None:
                segments += (node.sampled, node.context)
                node = node.parent
        ids: list[int] = []
        for segment in reversed(segments):
            ids += segment
        return ids

    def _snapshot(self) -> list[tuple[_Node, _Node | None, list[int]]]:
        with self._lock:
            return [(n, n.parent, n.context) for n in self._nodes]

    def _plan(self) -> tuple[list[_Path], dict[str, str], list[_Node]]:
        """Paths in canonical order with their roles, each node's role (its owning path's), all nodes."""
        snapshot = self._snapshot()
        children: dict[str, list[_Node]] = {n.node_id: [] for n, _, _ in snapshot}
        roots: list[_Node] = []
        for node, parent, _ in snapshot:
            (children[parent.node_id] if parent is not None else roots).append(node)
        context = {n.node_id: ctx for n, _, ctx in snapshot}
        parent_of = {n.node_id: p for n, p, _ in snapshot}

        groups = [kids for kids in children.values() if len(kids) > 1]
        same_key: dict[tuple[int, int], list[_Node]] = {}
        for root in roots:
            same_key.setdefault(_prefix_key(context[root.node_id], root.prompt_len), []).append(root)
        for candidates in same_key.values():
            if len(candidates) > 1:
                same_prompt: dict[tuple[int, ...], list[_Node]] = {}
                for root in candidates:
                    same_prompt.setdefault(tuple(context[root.node_id]), []).append(root)
                groups += [g for g in same_prompt.values() if len(g) > 1]
        discarded = set()
        for group in groups:
            if any(children[n.node_id] for n in group):
                discarded.update(n.node_id for n in group if not children[n.node_id])
        tools_in_use = any(n.request.get("tools") for n, _, _ in snapshot if n.node_id not in discarded)

        paths = []
        for leaf, _, _ in snapshot:
            if children[leaf.node_id]:
                continue
            path: list[tuple[_Node, list[int]]] = []
            current: _Node | None = leaf
            while current is not None:
                path.append((current, context[current.node_id]))
                current = parent_of[current.node_id]
            path.reverse()
            if leaf.node_id in discarded:
                role = DISCARDED
            elif not tools_in_use or any(n.request.get("tools") for n, _ in path):
                role = AGENT
            else:
                role = AUXILIARY
            paths.append((path, role))

        paths.sort(key=lambda p: (_ROLE_RANK[p[1]], -p[0][-1][0].end_len))
        ordered = []
        for _, run in groupby(paths, key=lambda p: (p[1], p[0][-1][0].end_len)):
            tied = list(run)
            if len(tied) > 1:
                tied.sort(key=lambda p: _path_tokens(p[0]))
            ordered += tied
        role_of: dict[str, str] = {}
        for path, role in ordered:
            for node, _ in path:
                role_of.setdefault(node.node_id, role)
        return ordered, role_of, [n for n, _, _ in snapshot]

    def training_sequences(self) -> list[TrainingSequence]:
        """One sequence per root-to-leaf path, in canonical order; each node trained in one sequence only."""
        ordered, _, _ = self._plan()
        trained: set[str] = set()
        out = []
        for path, role in ordered:
            size = path[-1][0].end_len
            tokens: list[int] = []
            mask, logps = [0] * size, [0.0] * size
            for node, ctx in path:
                tokens += ctx
                tokens += node.sampled
                if node.logprobs is not None and node.node_id not in trained:
                    trained.add(node.node_id)
                    mask[node.prompt_len : node.end_len] = [1] * len(node.sampled)
                    logps[node.prompt_len : node.end_len] = node.logprobs
            out.append(TrainingSequence(tokens, mask, logps, [n.node_id for n, _ in path], role))
        return out

    def to_training_trace(self) -> TrainingTrace:
        """One turn per node, in arrival order; valid by construction.

        The mask is 0 over the prompt and 1 over the completion when the call returned logprobs
        (else 0, with logprobs exported as 0.0). Metadata is the caller's plus `index` (arrival
        order), `parent_id` and `role`. Every id, logprob and dict was checked by `add_call` and
        prompts are rebuilt from those checked segments, so the model is built without
        re-validating millions of prompt ids (`TrainingTrace.from_json` validates on the way in).
        """
        ordered, role_of, nodes = self._plan()
        parent_of: dict[str, _Node | None] = {}
        prompts: dict[str, list[int]] = {}
        for path, _ in ordered:
            parent = None
            for node, ctx in path:
                if node.node_id not in prompts:
                    parent_of[node.node_id] = parent
                    prompts[node.node_id] = (
                        [*prompts[parent.node_id], *parent.sampled, *ctx] if parent is not None else list(ctx)
                    )
                parent = node
        turns = []
        for node in nodes:
            prompt = prompts[node.node_id]
            parent = parent_of[node.node_id]
            k = len(node.sampled)
            trainable = node.logprobs is not None
            mask = [0] * (len(prompt) + k)
            if trainable:
                mask[len(prompt) :] = [1] * k
            turns.append(
                TrainingTurn.model_construct(
                    node_id=node.node_id,
                    prompt_token_ids=prompt,
                    completion_token_ids=list(node.sampled),
                    per_token_logps=list(node.logprobs) if trainable else [0.0] * k,
                    loss_mask=mask,
                    request=dict(node.request),
                    response=dict(node.response),
                    metadata={
                        **node.metadata,
                        "index": node.index,
                        "parent_id": parent.node_id if parent is not None else None,
                        "role": role_of[node.node_id],
                    },
                )
            )
        return TrainingTrace.model_construct(turns=turns)

    def trace_json(self) -> bytes:
        """The bytes of ``to_training_trace().to_json()``, without building the model.

        The schema repeats each turn's whole prompt and request, so the output is the sum of prompt
        lengths; here each node's token segments, each message and each tools list is serialised once
        and its bytes spliced into every turn that repeats it (messages shared by identity, as a session
        stores them), so serialisation is O(distinct tokens and messages) and the rest is copying bytes.
        """
        ordered, role_of, nodes = self._plan()
        parent_of: dict[str, _Node | None] = {}
        pieces: dict[str, list[bytes]] = {}  # node id -> its prompt as JSON fragments without brackets
        for path, _ in ordered:
            parent = None
            for node, ctx in path:
                if node.node_id not in pieces:
                    parent_of[node.node_id] = parent
                    own = [_ids_json(ctx)] if ctx else []
                    if parent is not None:
                        own = [*pieces[parent.node_id], *([_ids_json(parent.sampled)] if parent.sampled else []), *own]
                    pieces[node.node_id] = own
                parent = node
        cached: dict[int, bytes] = {}  # id of a message or tools list -> its JSON

        def cached_json(value: Any) -> bytes:
            data = cached.get(id(value))
            if data is None:
                data = cached[id(value)] = orjson.dumps(value)
            return data

        out = [b'{"schema_version":1,"turns":[']
        for node in nodes:
            prompt = pieces[node.node_id]
            n_prompt, k = node.prompt_len, len(node.sampled)
            parent = parent_of[node.node_id]
            if node.logprobs is not None:
                logps, mask = orjson.dumps(node.logprobs), b"0," * n_prompt + b"1," * k
            else:
                logps, mask = b"[" + b"0.0," * k, b"0," * (n_prompt + k)
                logps = logps[:-1] + b"]" if k else b"[]"
            metadata = {
                **node.metadata,
                "index": node.index,
                "parent_id": parent.node_id if parent is not None else None,
                "role": role_of[node.node_id],
            }
            out += (
                b'{"node_id":', orjson.dumps(node.node_id),
                b',"prompt_token_ids":[', b",".join(prompt),
                b'],"completion_token_ids":[', _ids_json(node.sampled) if k else b"",
                b'],"per_token_logps":', logps,
                b',"loss_mask":[', mask[:-1],
                b'],"request":', _request_json(node.request, cached_json),
                b',"response":', orjson.dumps(node.response),
                b',"metadata":', orjson.dumps(metadata),
                b"},",
            )  # fmt: skip
        if nodes:
            out[-1] = b"}"
        out.append(b"]}")
        return b"".join(out)


def _ids_json(ids: list[int]) -> bytes:
    """A non-empty id list's JSON without its brackets (a fragment to splice)."""
    return orjson.dumps(ids)[1:-1]


def _request_json(request: dict[str, Any], cached_json: Callable[[Any], bytes]) -> bytes:
    """``orjson.dumps(request)``, splicing each message's and the tools list's cached JSON when the request
    has the proxy's shape (``{"messages": [...], "tools": [...]}``)."""
    messages, tools = request.get("messages"), request.get("tools")
    if list(request) != ["messages", "tools"] or type(messages) is not list or type(tools) is not list:
        return orjson.dumps(request)
    return b'{"messages":[' + b",".join(map(cached_json, messages)) + b'],"tools":' + cached_json(tools) + b"}"


def _path_tokens(path: list[tuple[_Node, list[int]]]) -> list[int]:
    tokens: list[int] = []
    for node, ctx in path:
        tokens += ctx
        tokens += node.sampled
    return tokens


def sequences_from_trace(trace: TrainingTrace) -> list[TrainingSequence]:
    """The training sequences of any ``TrainingTrace`` (ours or another producer's), masks kept exactly.

    A trace this module exported carries its graph: every turn's ``metadata`` has ``parent_id`` and
    ``role``. Such a trace is read back along those links (``linked_sequences``), each link checked
    to be an exact token prefix; no second graph is built. A trace without that structure (another
    producer's) is re-linked by the same exact-prefix rule in its arrival order (``metadata.index``
    when present). Either way a turn's completion mask is applied as given: positions with mask 0
    inside a completion stay context (0, logprob 0.0) in every sequence that contains the turn.
    """
    linked = linked_sequences(trace)
    return linked if linked is not None else rebuilt_sequences(trace)


def linked_sequences(trace: TrainingTrace) -> list[TrainingSequence] | None:
    """Sequences along the trace's own ``parent_id``/``role`` links, or None when it carries none or a
    link is not an exact prefix (the caller then rebuilds the graph). O(total prompt tokens)."""
    turns = {turn.node_id: turn for turn in trace.turns}
    parents: dict[str, str] = {}
    for turn in trace.turns:
        metadata = turn.metadata
        if "parent_id" not in metadata or metadata.get("role") not in _ROLE_RANK:
            return None
        parent_id = metadata["parent_id"]
        if parent_id is None:
            continue
        parent = turns.get(parent_id) if isinstance(parent_id, str) else None
        if parent is None:
            return None
        n_prompt, n_end = len(parent.prompt_token_ids), len(parent.prompt_token_ids) + len(parent.completion_token_ids)
        prompt = turn.prompt_token_ids
        if not (
            n_prompt < len(prompt)
            and n_end <= len(prompt)
            and prompt[:n_prompt] == parent.prompt_token_ids
            and prompt[n_prompt:n_end] == parent.completion_token_ids
        ):
            return None
        parents[turn.node_id] = parent_id
    inner = set(parents.values())
    leaves = [turn for turn in trace.turns if turn.node_id not in inner]
    paths = []
    for leaf in leaves:
        tokens = [*leaf.prompt_token_ids, *leaf.completion_token_ids]
        path = [leaf.node_id]
        while path[-1] in parents:
            path.append(parents[path[-1]])
        path.reverse()
        paths.append((_ROLE_RANK[leaf.metadata["role"]], -len(tokens), tokens, path, leaf.metadata["role"]))
    paths.sort(key=lambda p: p[:3])
    trained: set[str] = set()
    out = []
    for _, _, tokens, path, role in paths:
        mask, logps = [0] * len(tokens), [0.0] * len(tokens)
        for node_id in path:
            turn = turns[node_id]
            start = len(turn.prompt_token_ids)
            completion_mask = turn.loss_mask[start:]
            if node_id in trained or not any(completion_mask):
                continue
            trained.add(node_id)
            mask[start : start + len(completion_mask)] = completion_mask
            logps[start : start + len(completion_mask)] = [
                lp if keep else 0.0 for lp, keep in zip(turn.per_token_logps, completion_mask, strict=True)
            ]
        out.append(TrainingSequence(tokens, mask, logps, path, role))
    return out


def rebuilt_sequences(trace: TrainingTrace) -> list[TrainingSequence]:
    """Sequences of a trace without graph structure: its turns re-linked by exact prefix, in arrival order."""
    graph = CaptureGraph()
    turns = sorted(enumerate(trace.turns), key=lambda it: (it[1].metadata.get("index", it[0]), it[0]))
    masks: dict[str, tuple[int, list[int]]] = {}
    for _, turn in turns:
        n_prompt = len(turn.prompt_token_ids)
        completion_mask = turn.loss_mask[n_prompt:]
        logprobs = list(turn.per_token_logps) if any(completion_mask) else None
        graph.add_call(turn.prompt_token_ids, turn.completion_token_ids, logprobs, turn.request, node_id=turn.node_id)
        if logprobs is not None and not all(completion_mask):
            masks[turn.node_id] = (n_prompt, completion_mask)
    sequences = graph.training_sequences()
    for seq in sequences:
        for node_id in seq.node_ids:
            if node_id in masks:
                start, completion_mask = masks[node_id]
                for offset, keep in enumerate(completion_mask):
                    if not keep:
                        seq.loss_mask[start + offset] = 0
                        seq.logprobs[start + offset] = 0.0
    return sequences
