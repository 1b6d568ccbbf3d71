"""Bounded JSON nesting, checked by the serialisation the proxy does anyway.

orjson reads up to 1024 levels but writes at most ``ORJSON_MAX_DEPTH`` (254),
and everything a session stores comes back out wrapped a few levels deeper (a
trace turn puts a request's messages at depth 5). A request nested 250 levels
deep could therefore be read, answered and journaled, and then make its
session's trace unexportable for good. So the proxy refuses, at the door, any
request that nests deeper than ``MAX_REQUEST_DEPTH``, far below the writer's
limit, and never stores anything deeper.

The check costs no extra pass over the body: ``dumps_bounded`` serialises the
value inside ``ORJSON_MAX_DEPTH - max_depth`` one-element lists, so orjson's own
recursion limit trips exactly when the value nests deeper than ``max_depth``,
and slices the padding off. The proxy serialises the engine request once anyway;
this is that serialisation.
"""

from __future__ import annotations

import threading
from typing import Any

import orjson

ORJSON_MAX_DEPTH = 254
"""The deepest nesting ``orjson.dumps`` writes (255 levels raise "Recursion limit reached")."""

MAX_REQUEST_DEPTH = 128
"""The deepest nesting the proxy accepts in what it forwards or stores (a request, an engine reply)."""


class NestingError(ValueError):
    """A value nests deeper than the limit it was checked against."""


def dumps_bounded(value: Any, max_depth: int = MAX_REQUEST_DEPTH) -> bytes:
    """``orjson.dumps(value)``, raising ``NestingError`` if ``value`` nests deeper than ``max_depth``.

    Depth counts containers: ``[]`` and ``{}`` are 1, ``[[1]]`` is 2; a scalar is 0.
    """
    pad = ORJSON_MAX_DEPTH - max_depth
    outer, inner = _padding(pad)
    inner[0] = value
    try:
        data = orjson.dumps(outer)
    except orjson.JSONEncodeError as exc:
        if "Recursion limit" in str(exc):
            raise NestingError(f"JSON nests deeper than {max_depth} levels") from None
        raise
    finally:
        inner[0] = None
    return data[pad:-pad]


_chains = threading.local()


def _padding(pad: int) -> tuple[list[Any], list[Any]]:
    """This thread's ``pad`` nested one-element lists ``(outermost, innermost)``, built once per depth."""
    if not 0 < pad < ORJSON_MAX_DEPTH:
        raise ValueError(f"max_depth must be between 0 and {ORJSON_MAX_DEPTH}")
    cache = _chains.__dict__
    chain = cache.get(pad)
    if chain is None:
        inner: list[Any] = [None]
        outer = inner
        for _ in range(pad - 1):
            outer = [outer]
        chain = cache[pad] = (outer, inner)
    return chain


def check_depth(value: Any, max_depth: int = MAX_REQUEST_DEPTH) -> None:
    """Raise ``NestingError`` if ``value`` nests deeper than ``max_depth`` (one serialisation, for small values)."""
    dumps_bounded(value, max_depth)
