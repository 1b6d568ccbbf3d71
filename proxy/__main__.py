"""``python -m proxy``: run the capture proxy until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from proxy.server import CaptureProxy, ProxyConfig, connection_cap


def parse_args(argv: list[str] | None = None) -> ProxyConfig:
    """Command-line flags to a ``ProxyConfig``; one the config refuses is the parser's error (exit status 2)."""
    p = argparse.ArgumentParser(prog="python -m proxy", description="Exact-token capture proxy for agent sessions.")
    p.add_argument("--engine-url", required=True, help="engine base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--journal-dir", type=Path, required=True, help="per-session journals (recovered on start)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100, help="0 picks a free port (printed on start)")
    p.add_argument("--model", default=None, help="served model name upstream (default: the engine's first)")
    p.add_argument(
        "--admin-key",
        default=os.environ.get("HARNESS_PROXY_ADMIN_KEY"),
        help="control-plane key (env HARNESS_PROXY_ADMIN_KEY); minted and printed if unset on loopback",
    )
    p.add_argument("--keepalive-s", type=float, default=10.0)
    p.add_argument(
        "--upstream-timeout-s", type=float, default=600.0, help="one engine call's whole budget, retries included"
    )
    p.add_argument("--upstream-retries", type=int, default=3)
    p.add_argument("--upstream-backoff-s", type=float, default=2.0)
    p.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024)
    p.add_argument("--max-engine-clients", type=int, default=16, help="engine URLs with an open connection pool")
    p.add_argument("--max-open-journals", type=int, default=128, help="journal descriptors held open at once")
    p.add_argument(
        "--idle-timeout-s",
        type=float,
        default=60.0,
        help="close a connection with no complete request head this long after it opened or got its last reply",
    )
    p.add_argument(
        "--body-timeout-s", type=float, default=60.0, help="a request body must arrive whole within this (else 408)"
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="connections open at once; past it one is answered 503 and closed (default: the open-file limit "
        "less --max-open-journals, the upstream pool and a reserve)",
    )
    p.add_argument(
        "--stream-flush-s",
        type=float,
        default=0.05,
        help="after a stream's first text, write text to the agent at most this often (0: as it arrives)",
    )
    p.add_argument("--fsync", action="store_true", help="fsync the journal on every call (survives power loss)")
    p.add_argument("--no-probe", action="store_true", help="skip the engine tier probe at session creation")
    a = p.parse_args(argv)
    try:
        return ProxyConfig(
            engine_url=a.engine_url,
            journal_dir=a.journal_dir,
            host=a.host,
            port=a.port,
            model=a.model,
            admin_key=a.admin_key,
            keepalive_s=a.keepalive_s,
            upstream_timeout_s=a.upstream_timeout_s,
            upstream_retries=a.upstream_retries,
            upstream_backoff_s=a.upstream_backoff_s,
            max_body_bytes=a.max_body_bytes,
            max_engine_clients=a.max_engine_clients,
            max_open_journals=a.max_open_journals,
            fsync=a.fsync,
            probe_engines=not a.no_probe,
            idle_timeout_s=a.idle_timeout_s,
            body_timeout_s=a.body_timeout_s,
            max_connections=a.max_connections,
            stream_flush_s=a.stream_flush_s,
        )
    except ValueError as exc:  # a setting the proxy refuses (an exposed bind without a key): one line, status 2
        p.error(str(exc))


async def serve(config: ProxyConfig) -> None:
    """Run until a termination signal."""
    proxy = CaptureProxy(config)
    port = await proxy.start()
    gc.freeze()  # what start-up made (modules, recovered sessions) lives on: later collections skip it
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    key_note = "" if config.admin_key else f" admin_key={proxy.admin_key}"
    counts = f"sessions={len(proxy.sessions)} quarantined_journals={len(proxy.sessions.quarantined)}"
    counts += f" max_connections={connection_cap(config)} event_loop={type(loop).__module__.split('.')[0]}"
    print(f"proxy listening on http://{config.host}:{port} {counts}{key_note}", flush=True)
    await stop.wait()
    await proxy.stop()


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a dependency on Linux and macOS: it halves the proxy's CPU per
    call, ``bench/proxy_vs_openenv.py --before``), else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


GC_THRESHOLDS = (5000, 20, 20)
"""The proxy process's collector thresholds: a model call allocates a few thousand containers, and with
Python's default (700, 10, 10) the collections that follow cost ~28 us per call at one session and a full
collection over every live session's graph every few hundred calls; these cost ~11 us and almost never
collect fully (gc callbacks timed over 5,000 calls of ``bench/proxy_vs_openenv.py``'s 1x8 case)."""


def main(argv: list[str] | None = None) -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(parse_args(argv)), loop_factory=event_loop_factory())


if __name__ == "__main__":
    main()
