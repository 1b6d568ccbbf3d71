"""The journal's descriptor cache under threads: a descriptor is never closed (and its number reused for
another journal) while a write on it is in progress, whatever the cache's size."""

from __future__ import annotations

import os
import random
import sys
import threading
from collections import Counter
from pathlib import Path

from proxy.journal import JournalFiles, read_journal

JOURNALS = 24
THREADS = 4
APPENDS = 1500


def test_appends_from_threads_through_a_tiny_cache_land_whole_in_their_own_journal(tmp_path: Path) -> None:
    files = JournalFiles(max_open=2)
    journals = [files.create(tmp_path / f"j{i}.jsonl", {"kind": "session", "journal": i}) for i in range(JOURNALS)]
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for n in range(APPENDS):
                i = rng.randrange(JOURNALS)
                journals[i].append({"journal": i, "writer": seed, "n": n, "pad": "x" * rng.randrange(2000)})
        except BaseException as exc:  # reported below
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors[:3]
    assert len(files) <= 2
    per_journal: Counter[int] = Counter()
    for i in range(JOURNALS):
        contents = read_journal(tmp_path / f"j{i}.jsonl")
        assert not contents.torn
        head, *records = contents.records
        assert head == {"kind": "session", "journal": i}
        assert {r["journal"] for r in records} <= {i}, f"journal {i} holds another journal's records"
        per_journal[i] = len(records)
    assert sum(per_journal.values()) == THREADS * APPENDS
    files.close_all()
    assert len(files) == 0
    assert not [fd for fd in os.listdir("/proc/self/fd") if _points_into(fd, tmp_path)]


def _points_into(fd: str, directory: Path) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory))
    except OSError:
        return False
