"""Per-session append-only journals on disk, and reading them back.

Contract: ``SessionJournal.append(record)`` writes one JSON line with a single
``write(2)`` on an ``O_APPEND`` descriptor before returning, so a record the
caller appended survives the proxy being killed (SIGKILL) the moment after;
with ``fsync=True`` it also survives a machine crash, at the cost of a disk
flush per call. A write that stops part-way (a full disk, a file-size limit)
raises and cuts its partial line back off, so a record never follows a torn
one.

Descriptors: the journals of one registry share a ``JournalFiles`` cache of at
most ``max_open`` descriptors (least recently used closed first, never one in
use), so the number of sessions a proxy can hold or recover is not bounded by
its open-file limit; an active session keeps its descriptor and appends with
one ``write(2)``.

``JournalFiles.create`` makes a new journal exclusively, with its first record,
or leaves nothing on disk. ``read_journal`` returns every complete record and
where the complete part ends; a torn last line (a write cut by a crash) is not
a record, and ``cut_torn_tail`` removes it. Anything else that can't be read as
a journal raises ``JournalError``; ``quarantine`` moves such a file aside.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

import orjson

_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC


class JournalError(Exception):
    """A file that can't be read as a session journal."""


class JournalFiles:
    """The open-descriptor cache shared by the journals of one directory (see module contract)."""

    def __init__(self, max_open: int = 128, *, fsync: bool = False) -> None:
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.max_open = max_open
        self.fsync = fsync
        self._open: OrderedDict[SessionJournal, int] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Descriptors open now."""
        return len(self._open)

    def journal(self, path: Path) -> SessionJournal:
        """The journal at ``path`` (an existing file); no descriptor is opened until it is appended to."""
        return SessionJournal(path, self)

    def create(self, path: Path, first: dict[str, Any]) -> SessionJournal:
        """A new journal holding ``first``; ``FileExistsError`` if ``path`` exists. On any failure
        nothing is left: the record is serialised before the file is made, and a failed write
        closes and removes it."""
        line = orjson.dumps(first) + b"\n"
        fd = os.open(path, _APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write(fd, line, path, self.fsync)
            if self.fsync:  # the new directory entry must survive a crash too
                _fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        journal = SessionJournal(path, self)
        with self._lock:
            self._keep(journal, fd)
        return journal

    def close_all(self) -> None:
        """Close every descriptor, one mid-write when its write ends (the journals stay usable: an
        append reopens)."""
        with self._lock:
            for journal in list(self._open):
                if journal._pins:
                    journal._closing = True
                else:
                    os.close(self._open.pop(journal))

    def _acquire(self, journal: SessionJournal) -> int:
        with self._lock:
            if journal._deleted:  # its path may belong to a new session of the same id by now
                raise FileNotFoundError(errno.ENOENT, "the journal's session was deleted", str(journal.path))
            fd = self._open.get(journal)
            if fd is None:
                fd = os.open(journal.path, _APPEND)  # never O_CREAT: a journal removed under us is an error
                self._keep(journal, fd)
            else:
                self._open.move_to_end(journal)
            journal._pins += 1
            return fd

    def _release(self, journal: SessionJournal) -> None:
        with self._lock:
            journal._pins -= 1
            if journal._closing and journal._pins == 0:
                journal._closing = False
                fd = self._open.pop(journal, None)
                if fd is not None:
                    os.close(fd)

    def _keep(self, journal: SessionJournal, fd: int) -> None:
        """Hold ``fd`` for ``journal``; close the least recently used idle descriptors past ``max_open``."""
        self._open[journal] = fd
        while len(self._open) > self.max_open:
            idle = next((j for j in self._open if j._pins == 0 and j is not journal), None)
            if idle is None:  # every other descriptor is mid-write on another thread: over the cap for now
                return
            os.close(self._open.pop(idle))

    def _close(self, journal: SessionJournal) -> None:
        with self._lock:
            if journal._pins:  # mid-write on another thread: the writer closes it when done
                journal._closing = True
                return
            fd = self._open.pop(journal, None)
            if fd is not None:
                os.close(fd)


class SessionJournal:
    """The journal file of one session; its descriptor lives in the shared ``JournalFiles``."""

    __slots__ = ("_closing", "_deleted", "_files", "_pins", "path")

    def __init__(self, path: Path, files: JournalFiles) -> None:
        self.path = path
        self._files = files
        self._pins = 0  # appends in progress (guarded by the files' lock)
        self._closing = False
        self._deleted = False

    def append(self, record: dict[str, Any]) -> None:
        """Durably append one record (see module contract)."""
        line = orjson.dumps(record) + b"\n"
        files = self._files
        fd = files._acquire(self)
        try:
            _write(fd, line, self.path, files.fsync)
        finally:
            files._release(self)

    def close(self) -> None:
        """Close the descriptor if one is open; the file stays, and a later append reopens it."""
        self._files._close(self)

    def delete(self) -> None:
        """Close and remove the file; later appends fail (``FileNotFoundError``), never reopen the path."""
        self._deleted = True
        self.close()
        self.path.unlink(missing_ok=True)


def _write(fd: int, line: bytes, path: Path, fsync: bool) -> None:
    written = os.write(fd, line)
    if written != len(line):  # a short write to a regular file: the disk or a file-size limit is full
        with contextlib.suppress(OSError):  # cut the partial line off (one writer per journal)
            os.ftruncate(fd, os.fstat(fd).st_size - written)
        raise OSError(errno.ENOSPC, f"short write to journal {path} ({written} of {len(line)} bytes)")
    if fsync:
        os.fsync(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JournalContents(NamedTuple):
    """What ``read_journal`` found: the complete records, and the file's size and complete part."""

    records: list[dict[str, Any]]
    size: int
    complete_size: int  # bytes up to the last newline; past it is a torn record

    @property
    def torn(self) -> bool:
        return self.complete_size != self.size


def read_journal(path: Path) -> JournalContents:
    """Every complete record of a journal file, in append order (``JournalError`` if it isn't one).

    A torn last line is not an error (a crash mid-write leaves one); a complete line that is not a
    JSON object is, as is a file that is not a regular file.
    """
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise JournalError("not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise JournalError(f"unreadable: {exc}") from None
    complete = data.rfind(b"\n") + 1
    records = []
    for number, line in enumerate(data[:complete].split(b"\n")[:-1], start=1):
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise JournalError(f"line {number} is not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise JournalError(f"line {number} is not a JSON object")
        records.append(record)
    return JournalContents(records, len(data), complete)


def cut_torn_tail(path: Path, contents: JournalContents) -> None:
    """Remove the torn last line ``read_journal`` found, so appends start on a line of their own."""
    if contents.torn:
        with path.open("r+b") as f:
            f.truncate(contents.complete_size)


def quarantine(path: Path, directory: Path) -> Path:
    """Move ``path`` into ``directory`` (made if needed) under a name not taken there; returns the new path."""
    directory.mkdir(mode=0o700, exist_ok=True)
    target = directory / path.name
    n = 0
    while target.exists() or target.is_symlink():
        n += 1
        target = directory / f"{path.name}.{n}"
    os.rename(path, target)
    return target
