"""Recovery beside journals it can't read: every good session back with its exact trace, each bad file moved
to ``quarantine/`` with its bytes intact, said at startup and in /metrics, and the proxy serving."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import orjson

from proxy.client import ProxySession
from tests.proxy import proxy_processes as procs
from tests.proxy.proxy_stack import Stack, agent_turns

GOOD = 24


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _plant_bad_journals(journals: Path, keys: list[str]) -> dict[str, bytes]:
    """Damage some sessions' journals and add files that are not journals; returns what should be
    quarantined (file name -> its bytes)."""
    bad: dict[str, bytes] = {}

    def put(name: str, data: bytes) -> None:
        (journals / name).write_bytes(data)
        bad[name] = data

    lines = _lines(journals / f"{keys[0]}.jsonl")  # a record line garbled in the middle
    put(f"{keys[0]}.jsonl", b"".join([lines[0], lines[1][: len(lines[1]) // 2] + b"\n", *lines[2:]]))
    lines = _lines(journals / f"{keys[1]}.jsonl")  # a record that is JSON but not a call record
    put(f"{keys[1]}.jsonl", b"".join([lines[0], b'{"kind": "call"}\n', *lines[1:]]))
    lines = _lines(journals / f"{keys[2]}.jsonl")  # a session record with settings this proxy refuses
    head = orjson.loads(lines[0])
    head["config"]["purpose"] = "neither"
    put(f"{keys[2]}.jsonl", b"".join([orjson.dumps(head) + b"\n", *lines[1:]]))
    put("renamed.jsonl", (journals / f"{keys[4]}.jsonl").read_bytes())  # a good journal under another name
    put("foreign.jsonl", b'{"event": "login", "user": "x"}\n{"event": "logout"}\n')
    put("array.jsonl", b"[1, 2, 3]\n")
    put("empty.jsonl", b"")
    put("torn-head.jsonl", b'{"kind": "session", "id": "torn-head", "mod')  # a crash while creating it
    put("garbage.jsonl", b"\xff\xfe\x00" + os.urandom(2048) + b"\n" + os.urandom(512) + b"\n")
    put("garbage-no-newline.jsonl", os.urandom(4096).replace(b"\n", b"\x00"))
    (journals / "a-directory.jsonl").mkdir()
    bad["a-directory.jsonl"] = b""
    (journals / "notes.txt").write_text("not a journal name: left alone")
    return bad


def test_recovery_quarantines_what_it_cannot_read_and_recovers_the_rest(tmp_path: Path) -> None:
    journals = tmp_path / "journals"
    with procs.fake_engine() as engine:

        async def drive(url: str) -> tuple[list[ProxySession], dict[str, dict]]:
            async with aiohttp.ClientSession() as http:
                stack = Stack(None, url, http, procs.ADMIN_KEY)
                sessions = [await stack.create_session() for _ in range(GOOD)]
                await asyncio.gather(*(agent_turns(stack, s.api_key, 3, marker=s.session_id) for s in sessions))
                return sessions, {s.session_id: await stack.trace(s.session_id) for s in sessions}

        async def fetch(url: str, sessions: list[ProxySession]) -> tuple[dict[str, dict], str, list[str]]:
            async with aiohttp.ClientSession() as http:
                stack = Stack(None, url, http, procs.ADMIN_KEY)
                async with http.get(f"{url}/sessions", headers=stack.admin_headers) as resp:
                    listed = [s["id"] for s in (await resp.json())["sessions"]]
                traces = {s.session_id: await stack.trace(s.session_id) for s in sessions}
                async with http.get(f"{url}/metrics") as resp:
                    metrics = await resp.text()
                for s in sessions[:2]:  # recovered sessions keep capturing, the torn one (first) included
                    await agent_turns(stack, s.api_key, 1, marker=s.session_id)
                return traces, metrics, listed

        with procs.proxy(procs.url(engine), journals) as proxy:
            sessions, before = asyncio.run(drive(procs.url(proxy)))
        keys = [s.session_id for s in sessions]
        bad = _plant_bad_journals(journals, keys)
        torn = journals / f"{keys[3]}.jsonl"  # cut inside its last record: a crash mid-write
        complete = torn.read_bytes()
        cut = len(complete) - len(_lines(torn)[-1]) // 2
        torn.write_bytes(complete[:cut])
        good = sessions[3:]  # the torn one first
        expected = {s.session_id: before[s.session_id] for s in good}
        expected[keys[3]] = {**before[keys[3]], "turns": before[keys[3]]["turns"][:-1]}  # only the torn record lost

        with procs.proxy(procs.url(engine), journals) as proxy:
            assert f"sessions={len(good)} quarantined_journals={len(bad)}" in proxy.match["counts"], proxy.text
            for name in bad:
                assert name in proxy.text, f"the log does not say why {name} was not recovered"
            traces, metrics, listed = asyncio.run(fetch(procs.url(proxy), good))
        assert sorted(listed) == sorted(s.session_id for s in good)
        assert traces == expected
        assert f"proxy_quarantined_journals {len(bad)}" in metrics
        quarantined = journals / "quarantine"
        assert sorted(p.name for p in quarantined.iterdir()) == sorted(bad)
        for name, data in bad.items():
            if data:
                assert (quarantined / name).read_bytes() == data, f"{name} was changed on its way to quarantine"
        assert (journals / "notes.txt").exists()

        with procs.proxy(procs.url(engine), journals) as proxy:  # quarantine is not read again; nothing else moves
            assert f"sessions={len(good)} quarantined_journals=0" in proxy.match["counts"], proxy.text
