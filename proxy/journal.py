"""Per-session append-only journal on disk.

Contract: ``SessionJournal.append(record)`` writes one JSON line with a single
``write(2)`` on an ``O_APPEND`` descriptor before returning, so a record the
caller appended survives the proxy being killed (SIGKILL) the moment after;
with ``fsync=True`` it also survives a machine crash, at the cost of a disk
flush per call. ``read_journal`` returns every complete record; a torn last
line (a write cut by the kill) is ignored and truncated away on reopen.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


class SessionJournal:
    """The journal file of one session."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self._fsync = fsync
        _truncate_torn_tail(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def append(self, record: dict[str, Any]) -> None:
        """Durably append one record (see module contract)."""
        line = orjson.dumps(record) + b"\n"
        written = os.write(self._fd, line)
        if written != len(line):  # a short write on a regular file means the disk is full
            raise OSError(f"short write to journal {self.path}")
        if self._fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        """Close the descriptor; the file stays."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        """Close and remove the file."""
        self.close()
        self.path.unlink(missing_ok=True)


def read_journal(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the complete records of a journal file, in append order."""
    with path.open("rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                return
            yield orjson.loads(line)


def _truncate_torn_tail(path: Path) -> None:
    if not path.exists():
        return
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut != len(data):
        with path.open("r+b") as f:
            f.truncate(cut)
