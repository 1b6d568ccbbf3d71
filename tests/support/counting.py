"""Counting work instead of timing it: complexity claims checked by counts that do not depend on the machine.

``python_steps(fn)`` runs ``fn()`` and counts the Python lines it executed on this thread (and the
frames it entered: calls, generator resumptions); C functions such as ``min``, ``list.count`` or
pydantic-core's validators count nothing. Work done per token in Python, a ``for`` loop as much as a
generator, shows up as a count that grows with the token count; bulk C-level work does not.
``count_calls(monkeypatch, owner, name)`` wraps ``owner.name`` so that each call is counted (``.n``)
and passed through.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest


def python_steps[R](fn: Callable[[], R]) -> tuple[R, int]:
    """``(fn(), Python lines executed while it ran)`` on the calling thread (C functions count nothing)."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        nonlocal count
        count += 1  # "call" (a frame entered or a generator resumed), then one "line" per line run
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        result = fn()
    finally:
        sys.settrace(previous)
    return result, count


class CallCounter:
    """How many times the wrapped callable ran (``n``)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.n = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.n += 1
        return self.fn(*args, **kwargs)


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> CallCounter:
    """Replace ``owner.name`` (a module global or attribute) by a counting pass-through, undone at teardown."""
    counter = CallCounter(getattr(owner, name))
    monkeypatch.setattr(owner, name, counter)
    return counter
