"""An engine reply whose array of token ids is known to start with given ids: those are matched as bytes, not parsed.

A bridged call (``proxy.bridge``) knows what the engine's prompt starts with (the ids it sent, or for a speculative
call the turn it expects) and what a ``/tokenize`` of a history one message longer starts with (the last
rendering): thousands of ids it already holds. vLLM writes its replies as compact JSON (``[1,2,3]``), so where the
reply's bytes of that array start with the known ids written the same way (``KnownPrompt.json``), the ids are
those and only the rest of the array is parsed; the match is also the proof that the prefix holds. Anything else
(another spelling, another prefix, the key nested or repeated, no key) is parsed whole, as without this.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class KnownPrompt:
    """The ids an array of a reply is expected to start with (a list, or a packed ``array``) and their compact JSON
    without the closing bracket (``json``: ``b"[1,2,3"``)."""

    ids: list[int] | array[int]
    json: bytes


def open_json(ids: list[int]) -> bytes:
    """``ids`` as compact JSON without the closing bracket: the form ``KnownPrompt.json`` and ``extend`` take."""
    return orjson.dumps(ids)[:-1]


def extend(prompt_json: bytes, sampled_ids: list[int]) -> bytes:
    """The open JSON of a prompt followed by ``sampled_ids``, from the prompt's open JSON."""
    if not sampled_ids:
        return prompt_json
    return prompt_json + b"," + orjson.dumps(sampled_ids)[1:-1]


def loads_reply(data: bytes, name: str, known: KnownPrompt | None) -> tuple[Any, bytes | None]:
    """The JSON document ``data`` (``orjson.JSONDecodeError`` where it is not one), and, where it is an object whose
    top-level array ``name`` starts with ``known``'s ids, the open JSON of that whole array (its bytes without the
    closing bracket); the array is then ``known.ids`` + the rest, of ``known.ids``' type. Otherwise the second item
    is None and the document is parsed whole."""
    if known is None:
        return orjson.loads(data), None
    key = data.find(b'"%s":' % name.encode())  # its quotes can't appear unescaped inside a JSON string
    start = key + len(name) + 3
    end = start + len(known.json)
    close = data.find(b"]", end)
    if key < 0 or close < 0 or data[end : end + 1] not in (b",", b"]") or not data.startswith(known.json, start):
        return orjson.loads(data), None
    view = memoryview(data)
    try:
        parsed = orjson.loads(b"".join((view[:start], b"null", view[close + 1 :])))
        rest = orjson.loads(b"[" + data[end + 1 : close + 1]) if data[end : end + 1] == b"," else []
        ids = known.ids + (rest if isinstance(known.ids, list) else array(known.ids.typecode, rest))
    except (orjson.JSONDecodeError, TypeError, OverflowError):  # not plain ids after all: parsed whole, as ever
        return orjson.loads(data), None
    if not isinstance(parsed, dict) or name not in parsed or parsed[name] is not None:
        return orjson.loads(data), None  # the key was nested or repeated
    parsed[name] = ids
    return parsed, data[start:close]
