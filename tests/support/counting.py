"""Counting work instead of timing it: complexity claims checked by counts that do not depend on the machine.

``python_calls(fn)`` runs ``fn()`` and counts the Python frames it entered on this thread (function
calls and generator resumptions; C functions such as ``min``, ``list.count`` or pydantic-core's
validators are not counted). Work done per token in Python shows up as a count that grows with the
token count; bulk C-level work does not. ``count_calls(monkeypatch, owner, name)`` wraps
``owner.name`` so that each call is counted (``.n``) and passed through.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest


def python_calls[R](fn: Callable[[], R]) -> tuple[R, int]:
    """``(fn(), Python frames entered while it ran)`` on the calling thread."""
    count = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call":
            count += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(previous)
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
