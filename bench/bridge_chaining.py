"""Bridge chaining: per agent CLI, the share of turns that chain onto their parent, with and without the bridge.

Each registry CLI (opencode, claude-code, codex, mini-swe-agent) runs ``--sessions`` sessions of a shell task
per setting against the capture proxy and the embedded engine serving the warm-started tiny model, configured
as the agent tests configure it for a small model (``SMALL_MODEL_PROMPT``, temperature 0.2, a call budget).
A turn chains when the proxy linked it to a parent (``metadata.parent_id``). A continuation is a turn whose
history holds an assistant message: the first call of a session has none, nor has an auxiliary call that
starts its own history (opencode's title request), so those are roots whatever the bridge does.

    .venv/bin/python -m bench.bridge_chaining [--sessions 3] [--max-calls 5] [--agents opencode codex]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from harness_grpo.agents import AGENTS, SMALL_MODEL_PROMPT, agent_binary, run_agent
from harness_grpo.engine.embedded import TINY_WARM, EmbeddedEngine, resolve_model
from harness_grpo.engine.server import EngineServer
from harness_grpo.sandbox import TempDirSandbox
from harness_grpo.service_loop import ServiceLoop
from proxy.client import ProxyAdminClient
from proxy.server import CaptureProxy, ProxyConfig

TASK = "Create a file named hello.txt containing the word hi. Use the shell."
SAMPLING = {"temperature": 0.2}
MAX_OUTPUT_TOKENS = 160


@dataclass
class Chaining:
    """How a set of turns linked: ``chained`` of ``turns`` have a parent; ``continuations`` carry an assistant
    message in their history; ``forks`` are continuations that are roots; ``fallbacks`` the bridge's reasons."""

    turns: int = 0
    continuations: int = 0
    chained: int = 0
    forks: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)

    def add(self, trace: dict[str, Any]) -> Chaining:
        """Count the turns of one trace (``GET /sessions/{id}/trace``); returns self."""
        for turn in trace["turns"]:
            metadata = turn["metadata"]
            continuation = any(m.get("role") == "assistant" for m in turn["request"]["messages"])
            self.turns += 1
            self.continuations += continuation
            self.chained += metadata["parent_id"] is not None
            self.forks += continuation and metadata["parent_id"] is None
            if metadata.get("bridge_fallback"):
                self.fallbacks[metadata["bridge_fallback"]] += 1
        return self

    def share(self) -> str:
        """``chained/turns (percent)``."""
        return f"{self.chained}/{self.turns} ({self.chained / max(self.turns, 1):.0%})"


def run_session(
    admin: ProxyAdminClient, proxy_url: str, agent: str, workdir: Path, *, bridge: bool, max_calls: int
) -> dict[str, Any]:
    """One ``agent`` session on ``TASK`` through the proxy, ``bridge`` on or off; returns its trace."""
    session = admin.create_session(
        max_model_calls=max_calls, max_output_tokens=MAX_OUTPUT_TOKENS, sampling=SAMPLING, bridge=bridge
    )
    workdir.mkdir(parents=True, exist_ok=True)
    run = run_agent(
        agent,
        TempDirSandbox(prefix=f"{agent}-", dir=workdir),
        base_url=proxy_url,
        api_key=session.api_key,
        model="harness-model",
        task=TASK,
        timeout_s=300,
        system_prompt=SMALL_MODEL_PROMPT,
    )
    if run.timed_out:
        raise RuntimeError(f"{agent} did not finish\n{run.tail()}")
    return orjson.loads(admin.trace(session.session_id).to_json())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=3, help="sessions per agent and setting")
    parser.add_argument("--max-calls", type=int, default=5, help="the session's call budget")
    parser.add_argument("--agents", nargs="+", default=[a for a in AGENTS if agent_binary(a) is not None])
    a = parser.parse_args()

    loop = ServiceLoop("bridge-chaining")
    engine = EmbeddedEngine(resolve_model(TINY_WARM)[0]).start()
    server = EngineServer(engine)
    engine_url = loop.run(server.start())
    with tempfile.TemporaryDirectory(prefix="bridge-chaining-") as tmp:
        proxy = CaptureProxy(ProxyConfig(engine_url=engine_url, journal_dir=Path(tmp) / "journal", port=0))
        proxy_url = f"http://127.0.0.1:{loop.run(proxy.start())}"
        admin = ProxyAdminClient(proxy_url, proxy.admin_key)
        try:
            results: dict[tuple[str, bool], Chaining] = {}
            for agent in a.agents:
                for bridge in (False, True):
                    started = time.perf_counter()
                    counts = results[agent, bridge] = Chaining()
                    for i in range(a.sessions):
                        workdir = Path(tmp) / f"{agent}-{bridge}-{i}"
                        counts.add(run_session(admin, proxy_url, agent, workdir, bridge=bridge, max_calls=a.max_calls))
                    print(f"  {agent} bridge={bridge}: {time.perf_counter() - started:.0f} s", flush=True)
        finally:
            loop.run(proxy.stop())
            loop.run(server.stop())
            engine.stop()
            loop.close()
    print(
        f"\n{a.sessions} sessions per agent and setting, warm tiny model, budget {a.max_calls} calls. chained: turns "
        "with a parent; forks: continuations (an assistant message in the history) that are roots"
    )
    print(f"{'agent':16}{'bridge off: chained':>22}{'forks':>7}{'bridge on: chained':>21}{'forks':>7}  fallbacks (on)")
    for agent in a.agents:
        off, on = results[agent, False], results[agent, True]
        print(f"{agent:16}{off.share():>22}{off.forks:>7}{on.share():>21}{on.forks:>7}  {dict(on.fallbacks) or '-'}")


if __name__ == "__main__":
    main()
