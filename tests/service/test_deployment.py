"""The three services on separate machines, rehearsed on loopback: each in its own process, each found by URL.

The engine (``python -m harness_grpo.engine``, the warm tiny model, behind a recording relay), the capture proxy
started alone (``python -m proxy --admin-key``), our rollout service started alone and pointed at that proxy
(``python -m harness_grpo.serve --proxy-base-url``, the key in ``$HARNESS_PROXY_ADMIN_KEY``), and the trainer
(``launchers/train.py --env_url --vllm_server_base_url``). The run trains two steps on calls that went through that
proxy, and a wrong or missing key is refused at every boundary: the service exits 2 at start, saying so; the
proxy answers 401 to an agent key it never issued and to its admin plane without its key. A proxy bound off
loopback without an admin key refuses to start.
"""

from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from proxy.__main__ import parse_args
from tests.service.conftest import (
    RelayedEngine,
    check_two_steps,
    free_port,
    make_tasks,
    service_argv,
    service_env,
    start_proxy,
    start_service,
    train_two_steps,
)
from tests.support.processes import REPO_ROOT

ADMIN_KEY = "deployment-test-admin-key"
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def _status(url: str, key: str | None, body: bytes | None = None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _get(url: str, key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
        return response.read().decode()


@pytest.mark.timeout(600)
def test_engine_proxy_service_and_trainer_in_their_own_processes(relayed_engine: RelayedEngine, tmp_path: Path) -> None:
    dataset = make_tasks(tmp_path)
    with start_proxy(relayed_engine.url, tmp_path, admin_key=ADMIN_KEY) as proxy:
        proxy_url = proxy.match.group(1)
        refused = {  # started beside the one that serves: their imports overlap
            key: subprocess.Popen(
                service_argv("ours", dataset, relayed_engine.url, free_port(), proxy_base_url=proxy_url),
                env=service_env("ours", tmp_path, admin_key=key),
                cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for key in ("not-the-admin-key", None)
        }
        try:
            service = start_service(
                "ours", dataset, relayed_engine.url, tmp_path, proxy_base_url=proxy_url, admin_key=ADMIN_KEY
            )
        except BaseException:
            for process in refused.values():
                process.kill()
                process.wait()
            raise
        try:
            assert f"capture   {proxy_url} (external" in service.process.text, service.process.text
            for key, process in refused.items():
                _, err = process.communicate(timeout=240)
                lines = err.strip().splitlines()
                expected = "refused HARNESS_PROXY_ADMIN_KEY" if key else "set HARNESS_PROXY_ADMIN_KEY"
                assert process.returncode == 2 and len(lines) == 1 and expected in lines[0], (key, err[-2000:])

            assert _status(f"{proxy_url}/v1/chat/completions", "s" + "0" * 24, CHAT) == 401  # an agent key
            assert _status(f"{proxy_url}/v1/chat/completions", None, CHAT) == 401
            for key in (None, "not-the-admin-key"):  # the admin plane
                assert _status(f"{proxy_url}/sessions", key) == 401, key
                assert _status(f"{proxy_url}/sessions", key, b'{"purpose": "train"}') == 401, key

            log = train_two_steps(service, dataset, relayed_engine.url, tmp_path / "run")
        finally:
            service.process.stop()
        captured = re.search(r"^proxy_captured_completion_tokens_total (\S+)$", _get(f"{proxy_url}/metrics"), re.M)
        assert captured is not None and float(captured.group(1)) > 0  # the rollouts' calls went through that proxy
        assert _get(f"{proxy_url}/sessions", ADMIN_KEY) == '{"sessions":[]}'  # every session released
    check_two_steps(tmp_path / "run", relayed_engine.relay, log)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_a_proxy_bound_off_loopback_without_an_admin_key_refuses_to_start(
    host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m proxy``'s flags are refused before anything binds: exit status 2 and one line saying why."""
    monkeypatch.delenv("HARNESS_PROXY_ADMIN_KEY", raising=False)
    argv = ["--engine-url", "http://127.0.0.1:9", "--journal-dir", str(tmp_path / "journal"), "--host", host]
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert f"binding {host} (not loopback) requires an admin key (--admin-key or $HARNESS_PROXY_ADMIN_KEY)" in err
    assert parse_args([*argv, "--admin-key", ADMIN_KEY]).admin_key == ADMIN_KEY
    assert parse_args(argv[:-2]).host == "127.0.0.1"  # loopback: the key is minted
