"""The token-in bridge: a history this session sampled is prompted with the ids it sampled.

An agent re-sends the assistant turns it was given, but re-serialised (tool call arguments with other
spacing or key order, text stripped, reasoning dropped), so the engine's rendering of its history is no
longer the prompt + sampled ids of the previous call, and without the bridge every such turn is a new
root of the capture graph. The bridge matches a request's history against the turns this session
sampled and, on a match, sends the engine (``TOKENS_ROUTE``) the matched turn's prompt + sampled ids,
the template's closing ids of that turn, and the template's rendering of only the messages after it.

Match. ``History`` fingerprints a request: a digest chained over the tools, the template kwargs and
each message's semantic form (role; text with a leading ``<think>`` block cut off and outer whitespace
stripped; tool calls as name + canonical JSON of the parsed arguments; call ids and reasoning fields
ignored), taken at every assistant message. ``BridgeIndex`` maps the digest of each recorded turn's
request + response to the turn; the longest prefix of a new history that ends in an assistant message
and equals a recorded turn is bridged. Anything else the agent changed (compaction, an edited or
dropped message, other tools) matches a shorter prefix or none: the graph branches there or starts a
new root, as it does without the bridge.

Suffix. With turn ``N`` matched at message ``i``: ``prefix = tokenize(messages[:i+1])`` without and
``full = tokenize(messages)`` with the generation prompt (the request's tools and template kwargs, and
``N``'s sampled reasoning restored where the agent dropped it). The bridged prompt is ``N``'s prompt +
sampled ids, the ids ``prefix`` has after its last occurrence of ``N``'s final id (the stop id; at most
``MAX_TRAILER``), then ``full[len(prefix):]``. It is exact only when ``full`` starts with ``prefix``;
otherwise the call falls back to the engine's rendering of the messages and says why.

Cost. A call pays for its new messages, not its history: ``History`` takes over the digest state of the
session's previous call where that request is the start of this one (``extends``), and one ``/tokenize``
does where the session's last rendering (``full`` of the previous call) is of exactly the messages before
the matched turn, that turn carries no reasoning, and an earlier call rendered twice taught the template's
``closing`` (its trailer and the first id of the next message): ``full`` must start with the last rendering,
the turn closes at the first stop id after it, which ``closing`` must follow, and the prompt is the turn's
ids + ``full`` after that stop id, the same ids as from two renderings. Otherwise it renders both. The ids the
engine answers with (that ``full``, and the prompt of a bridged or speculative call) start with ids the session
holds, which are matched as bytes and not parsed again (``proxy.known_prompt``).

Speculation. Where the template renders this session's sampled turns as they were sampled (its last bridged
call's rendering started with the matched turn's ids: ``BridgeIndex.reproduces``), the bridged prompt would be
the engine's own rendering of the messages, so the call skips ``/tokenize`` and goes to the chat route as it
is (``BridgePlan.expects``: the matched turn), under the conditions of the one-``/tokenize`` path and with no
reasoning restored. The engine's prompt ids are checked after the call (``BridgeIndex.confirm``): starting
with the matched turn's ids they are the bridged prompt, and the turn is recorded as bridged (the graph does not
compare those ids again: ``CaptureGraph.add_call``'s ``extends``). Otherwise nothing
of the call is recorded or sent, the session stops speculating for good, and the call is made again through
the bridge; so a session pays at most one extra generation, and its trace is the one the bridge gives.

Reasoning. A template that drops past turns' reasoning once a new user turn follows (Qwen3's) fails the
prefix test there. ``bridge_reasoning="fork"`` (the default) falls back: the model sees what the
template shows it, as at inference without the bridge, and a tool loop (one user turn) is bridged
whole. ``"keep"`` bridges anyway (the suffix from the renderings without reasoning): fewer rows, but
the model sees its own past reasoning where inference would not, and contexts grow by it.

Fallback reasons (``metadata["bridge_fallback"]``, ``BridgeStats.fallbacks``), recorded only for a
history with an assistant message: ``rewrite`` (no prefix matches a sampled turn), ``re-render`` (the
template renders the matched history differently once the new messages follow, or does not close the
turn with its stop id), ``reasoning`` (fork: the template drops the matched turns' reasoning),
``unfinished`` (the matched turn ended on a length cut or could have ended on a stop string),
``unsupported`` (the engine serves no token route), ``engine`` (``/tokenize`` failed).
"""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.capture_graph import CaptureGraph
from proxy.engine_client import EngineClient, UpstreamError
from proxy.known_prompt import KnownPrompt, extend, open_json

REASONING_MODES = ("fork", "keep")
MAX_TRAILER = 8  # ids a template may put after a turn's stop id ("\n" for ChatML)
CLOSED_FINISH = frozenset({"stop", "tool_calls"})
REWRITE, RE_RENDER, REASONING, UNFINISHED, UNSUPPORTED, ENGINE = (
    "rewrite",
    "re-render",
    "reasoning",
    "unfinished",
    "unsupported",
    "engine",
)


def _text(content: Any) -> str | list[Any]:
    """A message's content as text (None, "" and text parts alike); non-text parts are kept as they are."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type", "text") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return content


def _arguments(arguments: Any) -> Any:
    """Tool call arguments parsed from JSON where they are a JSON string, else as given."""
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def _call(call: Any) -> Any:
    """A tool call as ``[name, parsed arguments]`` (its id dropped); anything else as it is."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call
    return [function.get("name"), _arguments(function.get("arguments"))]


def _semantic(message: Any) -> bytes:
    """The bytes two messages share iff an agent could have re-serialised one into the other."""
    if not isinstance(message, dict):
        return orjson.dumps(message)
    role = message.get("role")
    text = _text(message.get("content"))
    if isinstance(text, str):
        if role == "assistant" and "</think>" in text:
            text = text.split("</think>")[-1]
        text = text.strip()
    calls = message.get("tool_calls") or []
    calls = [_call(call) for call in calls] if isinstance(calls, list) else calls
    try:
        return orjson.dumps([role, text, calls], option=orjson.OPT_SORT_KEYS)
    except TypeError:  # parsed arguments orjson can't write back (an integer past 64 bits): compare them as sent
        return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)


def reasoning_of(message: dict[str, Any]) -> str:
    """The reasoning an assistant message carries: its reasoning field, else an inline ``<think>`` block."""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        return reasoning
    content = message.get("content")
    if isinstance(content, str) and "</think>" in content:
        return content.split("</think>")[0].split("<think>")[-1].strip("\n")
    return ""


def _is_assistant(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "assistant"


def _without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning")}
    if isinstance(out.get("content"), str) and "</think>" in out["content"]:
        out["content"] = out["content"].split("</think>")[-1].lstrip("\n")
    return out


class History:
    """A request's semantic fingerprints: ``boundaries`` is ``(index, digest)`` at each assistant message,
    the digest covering the tools, the template kwargs and every message up to that one.

    ``extends``: an earlier request's fingerprints (the session's previous call). Where its messages, tools
    and kwargs are equal to the start of these, its digest state is taken over and only the later messages
    are hashed, so a session's fingerprints cost its new messages, not its whole history, per call; and the
    start of ``messages`` (the request's list, changed in place) becomes its message objects, so the session's
    requests share them and the other comparisons of a history with an earlier one (the bridge's rendering,
    the journal's delta) are by identity, not by content.
    """

    __slots__ = ("_state", "boundaries", "head", "messages")

    def __init__(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        template_kwargs: dict[str, Any] | None,
        *,
        extends: History | None = None,
    ) -> None:
        self.head = orjson.dumps([tools or [], template_kwargs or {}], option=orjson.OPT_SORT_KEYS)
        self.messages = messages
        start = len(extends.messages) if extends is not None else 0
        if extends is not None and extends.head == self.head and messages[:start] == extends.messages:
            messages[:start] = extends.messages  # the same objects: later comparisons of them are by identity
            state, self.boundaries = extends._state.copy(), list(extends.boundaries)
        else:
            state, self.boundaries, start = hashlib.blake2b(self.head), [], 0
        for index in range(start, len(messages)):
            message = messages[index]
            state.update(_semantic(message))
            if _is_assistant(message):
                self.boundaries.append((index, state.digest()))
        self._state = state

    def key(self, response_message: dict[str, Any]) -> bytes:
        """The digest of this history followed by ``response_message``: what a later history that re-sends the
        reply matches at its assistant message."""
        state = self._state.copy()
        state.update(_semantic(response_message))
        return state.digest()


@dataclass(frozen=True, slots=True)
class _Sampled:
    node_id: str
    reasoning: str  # what the turn sampled as reasoning, "" when nothing
    closed: bool  # it ended on an id the template closes the turn with (not a length cut, no stop string)


@dataclass
class BridgeStats:
    """A session's bridge counters: turns bridged, prompt ids their rows did not repeat, fallbacks by reason;
    ``speculated``: bridged turns the engine rendered (no ``/tokenize``), ``missed``: speculative calls whose
    rendering was not the bridged prompt (made again through the bridge)."""

    bridged: int = 0
    saved_tokens: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)
    speculated: int = 0
    missed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "bridged": self.bridged,
            "saved_tokens": self.saved_tokens,
            "fallbacks": dict(self.fallbacks),
            "speculated": self.speculated,
            "missed": self.missed,
        }


class BridgeIndex:
    """The turns a session sampled, by the fingerprint of their request + response, and the bridge's counters.

    It also keeps what makes the next call cheap: ``last``, the previous call's fingerprints (``History``'s
    ``extends``); the previous call's rendering (``_Rendered``); and ``closing``, the ids the template puts
    after a closed turn's stop id and the first id of the message that follows, learned from a call rendered
    twice; and whether calls may be speculative (``reproduces``: the last bridged call's rendering started with its
    matched turn's ids; never again once a speculative call ``missed``).
    """

    def __init__(self) -> None:
        self._sampled: dict[bytes, _Sampled] = {}
        self.stats = BridgeStats()
        self.last: History | None = None
        self.rendered: _Rendered | None = None
        self.closing: array[int] | None = None
        self.reproduces = False
        self.missed = False
        self._end_json: tuple[str, bytes] | None = None  # the last turn's node and its ids' open JSON

    def add(
        self,
        node_id: str,
        history: History,
        response: dict[str, Any],
        sampled_ids: list[int],
        metadata: dict[str, Any],
    ) -> None:
        """Index a recorded turn (``response``: its ``{"choices": [{"message", "finish_reason"}]}``; a turn without
        a message is not indexed) and count it from its ``metadata`` (``BridgePlan.metadata``)."""
        choices = response.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        message = choice.get("message")
        if isinstance(message, dict):
            closed = bool(sampled_ids) and choice.get("finish_reason") in CLOSED_FINISH
            closed = closed and not (metadata.get("sampling_params") or {}).get("stop")
            self._sampled.setdefault(history.key(message), _Sampled(node_id, reasoning_of(message), closed))
        if metadata.get("bridge_speculated"):  # the engine's rendering of these messages is the turn's prompt
            self.rendered = _Rendered(history.messages, history.head, None, node_id)
        if metadata.get("bridged"):
            self.stats.bridged += 1
            self.stats.saved_tokens += metadata.get("bridge_saved_tokens", 0)
            self.stats.speculated += bool(metadata.get("bridge_speculated"))
        elif metadata.get("bridge_fallback"):
            self.stats.fallbacks[metadata["bridge_fallback"]] += 1

    def remember_end(
        self, node_id: str, prompt_ids: list[int], prompt_json: bytes | None, sampled_ids: list[int]
    ) -> None:
        """Keep the open JSON of a recorded turn's prompt + sampled ids while calls may speculate, so the next
        call's reply is matched against it (``known_prompt``); ``prompt_json``: the engine's, when at hand."""
        if not self.reproduces:
            self._end_json = None
            return
        self._end_json = (node_id, extend(open_json(prompt_ids) if prompt_json is None else prompt_json, sampled_ids))

    def known_prompt(self, plan: BridgePlan, graph: CaptureGraph) -> KnownPrompt | None:
        """What the engine's prompt for the speculative ``plan`` starts with if the speculation holds (its
        matched turn's ids), where that turn's JSON is kept (``remember_end``); else None."""
        if plan.expects is None or self._end_json is None or self._end_json[0] != plan.expects:
            return None
        return KnownPrompt(graph.end_ids(plan.expects), self._end_json[1])

    def confirm(self, plan: BridgePlan, graph: CaptureGraph, prompt_ids: Any) -> bool:
        """Whether the engine's ``prompt_ids`` for the speculative ``plan`` are its bridged prompt (they start with
        the ids of ``plan.expects`` in ``graph``); if not, the session stops speculating."""
        assert plan.expects is not None
        if isinstance(prompt_ids, list) and graph.extends(plan.expects, prompt_ids):
            return True
        self.reproduces, self.missed = False, True
        self.stats.missed += 1
        return False

    def matches(self, history: History) -> list[tuple[int, _Sampled]]:
        """``(message index, turn)`` of every assistant message of ``history`` whose prefix this session sampled."""
        return [(index, hit) for index, digest in history.boundaries if (hit := self._sampled.get(digest))]


@dataclass(frozen=True, slots=True)
class BridgePlan:
    """How one call is prompted: ``tokens`` (bridged), the engine's rendering checked against ``expects``
    (speculative, see the module docstring), or the engine's rendering (neither, with the ``fallback`` reason when
    the history had an assistant message and the bridge was on)."""

    history: History | None  # None: the session's bridge is off, and nothing was fingerprinted
    tokens: list[int] | None = None
    fallback: str | None = None
    saved_tokens: int = 0  # bridged: the parent's ids a row would repeat had the engine rendered the messages
    expects: str | None = None  # speculative: the node whose ids the engine's rendering must start with
    matched: str | None = None  # bridged: the node whose ids ``tokens`` start with

    def metadata(self) -> dict[str, Any]:
        """The turn's bridge metadata: ``bridged``; ``bridge_saved_tokens`` when bridged (and ``bridge_speculated``
        when the engine rendered it: a speculative plan is recorded only once confirmed), ``bridge_fallback`` when
        there is a reason it was not."""
        if self.expects is not None:
            return {"bridged": True, "bridge_saved_tokens": 0, "bridge_speculated": True}
        out: dict[str, Any] = {"bridged": self.tokens is not None}
        if self.tokens is not None:
            out["bridge_saved_tokens"] = self.saved_tokens
        if self.fallback:
            out["bridge_fallback"] = self.fallback
        return out


@dataclass(frozen=True, slots=True)
class _Rendered:
    """A call's rendering (with the generation prompt) of ``messages`` under ``head`` (the tools and template
    kwargs, as ``History`` writes them): ``ids`` from ``/tokenize``, else the prompt of the recorded call
    ``node_id`` (a speculative call's, whose ids are read back from the graph only when needed)."""

    messages: list[dict[str, Any]]
    head: bytes
    ids: array[int] | None
    node_id: str | None = None
    json: bytes | None = None  # ``ids``' open JSON (``proxy.known_prompt``), to match the next rendering against

    def rendering(self, graph: CaptureGraph) -> array[int] | None:
        """The rendering's ids; None where an id does not fit 64 bits (no ``/tokenize`` answer has those)."""
        if self.ids is not None:
            return self.ids
        assert self.node_id is not None, "a rendering holds its ids or its call's node"
        try:
            return array("q", graph.prompt_ids(self.node_id))
        except OverflowError:
            return None


async def plan_prompt(
    body: dict[str, Any],
    *,
    index: BridgeIndex,
    graph: CaptureGraph,
    client: EngineClient,
    enabled: bool,
    reasoning: str,
    has_route: Callable[[], Awaitable[bool]],
) -> BridgePlan:
    """The prompt of the engine request ``body`` (see the module docstring); never raises for the engine's sake:
    an engine that can't bridge is a fallback, and the chat route then answers as it would have."""
    if not enabled:
        return BridgePlan(None)
    messages, tools, kwargs = body["messages"], body.get("tools"), body.get("chat_template_kwargs")
    history = index.last = History(messages, tools, kwargs, extends=index.last)
    if not history.boundaries:
        return BridgePlan(history)
    matches = index.matches(history)
    if not matches:
        return BridgePlan(history, fallback=REWRITE)
    end, turn = matches[-1]
    if not turn.closed:
        return BridgePlan(history, fallback=UNFINISHED)
    try:
        if not await has_route():
            return BridgePlan(history, fallback=UNSUPPORTED)
        restored = list(messages)
        for at, hit in matches:
            if hit.reasoning and not reasoning_of(restored[at]):
                restored[at] = {**restored[at], "reasoning_content": hit.reasoning}
        request = _tokenize_request(body)
        full = at = None
        rendered, closing = index.rendered, index.closing  # the last call's: this call's rendering replaces it
        speculate = index.reproduces and rendered is not None and restored == messages
        if speculate and _renders_once(rendered, messages, end, history):
            return BridgePlan(history, expects=turn.node_id)
        ids = graph.end_ids(turn.node_id)
        if rendered is not None and closing is not None and _renders_once(rendered, restored, end, history):
            before = rendered.rendering(graph)
            if before is not None:
                known = None if rendered.json is None else KnownPrompt(before, rendered.json)
                full = await _full(client, request, restored, history, index, known)
                at = _closing_stop(full, before, closing, ids[-1])
        if at is not None:
            tokens = ids + full[at + 1 :].tolist()
        else:
            renderings = await _renderings(client, request, restored, end, history, index, full)
            if renderings is None and any(reasoning_of(m) for m in restored[: end + 1] if _is_assistant(m)):
                stripped = [_without_reasoning(m) if _is_assistant(m) else m for m in restored[: end + 1]]
                renderings = await _renderings(client, request, stripped + restored[end + 1 :], end, None, index)
                if renderings is not None and reasoning == "fork":
                    return BridgePlan(history, fallback=REASONING)
            if renderings is None:
                return BridgePlan(history, fallback=RE_RENDER)
            prefix, suffix, full = renderings
            trailer = _trailer(prefix, ids[-1])
            if trailer is None:
                return BridgePlan(history, fallback=RE_RENDER)
            index.closing = trailer + suffix[:1]
            tokens = ids + (trailer + suffix).tolist()
    except UpstreamError:
        return BridgePlan(history, fallback=ENGINE)
    saved = 0 if full[: len(ids)].tolist() == ids else len(ids)  # the rendering extends the turn anyway: nothing saved
    index.reproduces = not saved and not index.missed
    return BridgePlan(history, tokens=tokens, saved_tokens=saved, matched=turn.node_id)


def _tokenize_request(body: dict[str, Any]) -> dict[str, Any]:
    """What a ``/tokenize`` of ``body``'s chat takes from it besides the messages."""
    return {"model": body["model"], **{key: body[key] for key in ("tools", "chat_template_kwargs") if body.get(key)}}


def _renders_once(rendered: _Rendered, messages: list[dict[str, Any]], end: int, history: History) -> bool:
    """Whether one ``/tokenize`` may do: the session's last rendering is of exactly ``messages[:end]`` (the history
    before the matched turn ``end``) under the same tools and kwargs, and the matched turn carries no reasoning
    (a template may drop it once more messages follow)."""
    return not reasoning_of(messages[end]) and rendered.head == history.head and messages[:end] == rendered.messages


def _closing_stop(full: array[int], before: array[int], closing: array[int], stop_id: int) -> int | None:
    """Where the matched turn closes in ``full``, the rendering of a history ``_renders_once`` admitted: ``full``
    starts with ``before`` (the last rendering), and the first ``stop_id`` after it is followed by ``closing``
    (the template's trailer and the first id of a message, learned from a call rendered twice). None where that
    does not hold."""
    if full[: len(before)] != before:  # same-type arrays compare as memory
        return None
    try:
        at = full.index(stop_id, len(before))
    except ValueError:
        return None
    return at if full[at + 1 : at + 1 + len(closing)] == closing else None


async def _full(
    client: EngineClient,
    request: dict[str, Any],
    messages: list[dict[str, Any]],
    history: History | None,
    index: BridgeIndex,
    known: KnownPrompt | None = None,
) -> array[int]:
    """The rendering of ``messages`` with the generation prompt (expected to start with ``known``), kept as the
    session's last rendering when ``history`` is the request's (not for a variant of its messages)."""
    full, json = await client.tokenize_known({**request, "messages": messages, "add_generation_prompt": True}, known)
    if history is not None:
        index.rendered = _Rendered(messages, history.head, full, json=json)
    return full


async def _renderings(
    client: EngineClient,
    request: dict[str, Any],
    messages: list[dict[str, Any]],
    end: int,
    history: History | None,
    index: BridgeIndex,
    full: array[int] | None = None,
) -> tuple[array[int], array[int], array[int]] | None:
    """``(prefix, suffix, full)``: the rendering of ``messages[:end+1]``, what the rendering of all of them (with
    the generation prompt, ``full``: rendered here unless given) adds to it; None when ``full`` does not start
    with ``prefix``."""
    prefix_request = {**request, "messages": messages[: end + 1], "add_generation_prompt": False}
    if full is None:
        prefix, full = await asyncio.gather(
            client.tokenize(prefix_request), _full(client, request, messages, history, index)
        )
    else:
        prefix = await client.tokenize(prefix_request)
    if len(full) <= len(prefix) or full[: len(prefix)] != prefix:
        return None
    return prefix, full[len(prefix) :], full


def _trailer(rendering: array[int], stop_id: int) -> array[int] | None:
    """The ids ``rendering`` has after its last ``stop_id``, if that is within its last ``MAX_TRAILER + 1`` ids."""
    for position in range(len(rendering) - 1, max(-1, len(rendering) - MAX_TRAILER - 2), -1):
        if rendering[position] == stop_id:
            return rendering[position + 1 :]
    return None
