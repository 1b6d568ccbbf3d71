"""The engine bounds its connections in time: an idle connection is closed after ``idle_timeout_s`` and a body
that trickles in slower than ``body_timeout_s`` is a 408, while other requests keep being served."""

from __future__ import annotations

import socket
import time

import orjson

from harness_grpo.engine.embedded import EmbeddedEngine
from harness_grpo.engine.server import ServerThread
from harness_grpo.tiny_model import SERVED_MODEL_NAME

TIMEOUT_S = 0.5


def _closed_after(sock: socket.socket, limit_s: float) -> tuple[float, bytes]:
    """Seconds until the peer closed ``sock`` (``inf`` if still open after ``limit_s``), and what it sent."""
    started, received = time.monotonic(), b""
    sock.settimeout(0.05)
    while time.monotonic() - started < limit_s:
        try:
            piece = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionError:
            break
        if not piece:
            break
        received += piece
    else:
        return float("inf"), received
    return time.monotonic() - started, received


def test_idle_and_trickling_connections_are_closed(tiny_path) -> None:
    engine = EmbeddedEngine(tiny_path, served_model_name=SERVED_MODEL_NAME).start()
    server = ServerThread(engine, idle_timeout_s=TIMEOUT_S, body_timeout_s=TIMEOUT_S)
    try:
        host, port = server.start().removeprefix("http://").split(":")
        idle = socket.create_connection((host, int(port)))
        slow = socket.create_connection((host, int(port)))
        body = orjson.dumps({"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]})
        slow.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:5]
        )
        idle_s, idle_data = _closed_after(idle, 10 * TIMEOUT_S)
        assert idle_s < 4 * TIMEOUT_S and idle_data == b"", (idle_s, idle_data)
        slow_s, slow_data = _closed_after(slow, 10 * TIMEOUT_S)
        assert slow_data.startswith(b"HTTP/1.1 408"), slow_data[:200]
        assert b"did not arrive within" in slow_data and slow_s < 6 * TIMEOUT_S
        with socket.create_connection((host, int(port))) as ok:  # the engine still serves
            ok.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert _closed_after(ok, 5)[1].startswith(b"HTTP/1.1 200")
        idle.close()
        slow.close()
    finally:
        server.stop()
        engine.stop()
