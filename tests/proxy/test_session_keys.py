"""An agent's API key is a secret distinct from its session's id: minted by the proxy, kept only as a hash,
never in a journal, a trace or a log line; journals are private to the proxy's user; a restarted proxy
accepts the old keys and never an id (or any short string) as a key."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
from pathlib import Path

import aiohttp
import orjson
import pytest

from proxy.client import ProxyClientError, ProxySession
from proxy.journal import SessionJournal
from proxy.sessions import key_hash
from tests.proxy import proxy_processes as procs
from tests.proxy.proxy_stack import Stack, agent_turns, run_stack

HI = [{"role": "user", "content": "hi"}]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _assert_private(journals: Path) -> None:
    assert _mode(journals) == 0o700, oct(_mode(journals))
    for path in journals.glob("*.jsonl"):
        assert _mode(path) == 0o600, (path.name, oct(_mode(path)))


def test_keys_are_minted_secrets_never_journaled_traced_or_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    journals = tmp_path / "journals"
    seen: list[ProxySession] = []
    append = SessionJournal.append
    disk = {"full": False}

    def append_unless_full(journal: SessionJournal, record: dict) -> None:
        if disk["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        append(journal, record)

    monkeypatch.setattr(SessionJournal, "append", append_unless_full)

    async def body(stack: Stack) -> None:
        named = await stack.create_session(session_id="x", purpose="eval")  # a one-character id is a name
        minted = await stack.create_session()
        seen.extend([named, minted])
        for session in seen:
            assert session.api_key != session.session_id and len(session.api_key) >= 43
        assert named.api_key != minted.api_key
        replies = await agent_turns(stack, minted.api_key, 3)
        await agent_turns(stack, named.api_key, 1)
        for wrong in (named.session_id, minted.session_id, "x", named.api_key[:-1], key_hash(minted.api_key)):
            status, error = await stack.chat(wrong, HI)
            assert status == 401 and error["error"]["type"] == "authentication_error", (wrong, error)
        assert (await stack.chat(minted.api_key, HI, n=2))[0] == 400
        disk["full"] = True  # a failed journal write is logged, naming the session
        assert (await stack.chat(minted.api_key, HI))[0] == 500
        disk["full"] = False
        with pytest.raises(ProxyClientError) as chosen:
            await stack.create_session(api_key="k" * 64)
        assert chosen.value.status == 400 and "api_key" in str(chosen.value)
        traces = [await asyncio.to_thread(stack.admin._call, "GET", f"/sessions/{s.session_id}/trace") for s in seen]
        assert [t["completion_token_ids"] for t in orjson.loads(traces[1])["turns"]] == [
            r["choices"][0]["token_ids"] for r in replies
        ]
        for session in seen:
            secret = session.api_key.encode()
            assert all(secret not in trace for trace in traces)
            for path in journals.rglob("*"):
                if path.is_file():
                    assert secret not in path.read_bytes(), path
            header = orjson.loads((journals / f"{session.session_id}.jsonl").read_bytes().split(b"\n")[0])
            assert header["key_sha256"] == key_hash(session.api_key)
        _assert_private(journals)

    with caplog.at_level(logging.DEBUG):
        run_stack(body, journals)
    assert f"session {seen[1].session_id}: journal write failed" in caplog.text  # log lines name the id
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    for session in seen:
        assert session.api_key not in logged


def test_a_restarted_proxy_accepts_the_old_keys_only_and_keeps_journals_private(tmp_path: Path) -> None:
    journals = tmp_path / "journals"
    with procs.fake_engine() as engine:

        async def drive(url: str) -> tuple[list[ProxySession], dict[str, dict]]:
            async with aiohttp.ClientSession() as http:
                stack = Stack(None, url, http, procs.ADMIN_KEY)
                sessions = [await stack.create_session(session_id="a"), await stack.create_session()]
                for session in sessions:
                    await agent_turns(stack, session.api_key, 2, marker=session.session_id)
                return sessions, {s.session_id: await stack.trace(s.session_id) for s in sessions}

        async def after_restart(url: str, sessions: list[ProxySession]) -> dict[str, dict]:
            async with aiohttp.ClientSession() as http:
                stack = Stack(None, url, http, procs.ADMIN_KEY)
                for session in sessions:
                    for wrong in (session.session_id, session.session_id[:1], session.api_key.upper()):
                        assert (await stack.chat(wrong, HI))[0] == 401, wrong
                    await agent_turns(stack, session.api_key, 1, marker=session.session_id)
                return {s.session_id: await stack.trace(s.session_id) for s in sessions}

        with procs.proxy(procs.url(engine), journals) as proxy:
            _assert_private(journals)
            sessions, before = asyncio.run(drive(procs.url(proxy)))
            proxy.kill()
        os.chmod(journals, 0o755)  # widened by hand: recovery takes the extra bits back
        os.chmod(journals / "a.jsonl", 0o644)
        with procs.proxy(procs.url(engine), journals) as proxy:
            assert proxy.match["counts"].split()[0] == "sessions=2", proxy.text
            _assert_private(journals)
            after = asyncio.run(after_restart(procs.url(proxy), sessions))
        for session in sessions:
            assert session.api_key not in proxy.text
            assert after[session.session_id]["turns"][:2] == before[session.session_id]["turns"]
            assert len(after[session.session_id]["turns"]) == 3


def test_a_journal_without_a_key_hash_is_quarantined(tmp_path: Path) -> None:
    """A journal whose session record holds no key hash (an id-as-key proxy's) serves no agent: set aside."""
    journals = tmp_path / "journals"
    journals.mkdir(mode=0o700)
    config = {"purpose": "eval", "sampling": None, "max_model_calls": None, "max_output_tokens": None}
    config |= {"llm_url": None, "model": None, "metadata": {}}
    head = {"kind": "session", "id": "old", "model": "m", "config": config}
    (journals / "old.jsonl").write_bytes(orjson.dumps(head) + b"\n")

    async def body(stack: Stack) -> None:
        assert stack.proxy is not None and stack.proxy.sessions.quarantined[0][0] == "old.jsonl"
        assert (await stack.chat("old", HI))[0] == 401

    run_stack(body, journals)
    assert (journals / "quarantine" / "old.jsonl").exists()
    assert _mode(journals / "quarantine") == 0o700
