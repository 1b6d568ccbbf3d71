"""Proxy counters rendered in the Prometheus text exposition format."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.sessions import Session

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class ProxyMetrics:
    """Process-wide counters; per-session figures are read from the sessions at render time."""

    requests: int = 0
    unauthorized: int = 0
    client_errors: int = 0
    upstream_errors: int = 0
    sessions_created: int = 0
    captured_tokens: int = 0
    connections_refused: int = 0  # accepted past max_connections and closed at once
    body_timeouts: int = 0
    call_latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    call_latency_sum: float = 0.0

    def observe_call(self, seconds: float) -> None:
        """Record the wall time of one completed model call."""
        self.call_latency_counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.call_latency_sum += seconds

    def render(
        self,
        sessions: Iterable[Session],
        upstream_retries: int,
        *,
        quarantined_journals: int = 0,
        open_connections: int = 0,
    ) -> str:
        """The Prometheus text exposition of every counter."""
        sessions = list(sessions)
        lines = []

        def metric(name: str, kind: str, help_: str, value: float) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"])

        metric("proxy_requests_total", "counter", "Model-call requests received.", self.requests)
        metric("proxy_unauthorized_total", "counter", "Requests with an unknown API key.", self.unauthorized)
        metric("proxy_client_errors_total", "counter", "Requests refused with a 4xx.", self.client_errors)
        metric("proxy_upstream_errors_total", "counter", "Engine failures reported to agents.", self.upstream_errors)
        metric("proxy_upstream_retries_total", "counter", "Engine calls retried.", upstream_retries)
        metric("proxy_sessions_created_total", "counter", "Sessions created.", self.sessions_created)
        metric("proxy_sessions", "gauge", "Live sessions.", len(sessions))
        metric(
            "proxy_quarantined_journals",
            "gauge",
            "Journals recovery could not read, moved to the quarantine directory at start.",
            quarantined_journals,
        )
        metric("proxy_connections_open", "gauge", "Client connections open.", open_connections)
        metric(
            "proxy_connections_refused_total",
            "counter",
            "Connections accepted past max_connections and closed at once.",
            self.connections_refused,
        )
        metric(
            "proxy_body_timeouts_total",
            "counter",
            "Requests whose body did not arrive within body_timeout_s (answered 408).",
            self.body_timeouts,
        )
        metric("proxy_captured_calls_total", "counter", "Calls recorded.", sum(s.stats.calls for s in sessions))
        metric("proxy_captured_completion_tokens_total", "counter", "Sampled tokens recorded.", self.captured_tokens)
        bridges = [s.bridge.stats for s in sessions]
        metric(
            "proxy_bridged_turns_total",
            "counter",
            "Turns of live sessions prompted with the ids their history was sampled as.",
            sum(b.bridged for b in bridges),
        )
        metric(
            "proxy_bridge_saved_tokens_total",
            "counter",
            "Prompt ids of live sessions' bridged turns a training row would repeat had the engine rendered them.",
            sum(b.saved_tokens for b in bridges),
        )
        metric(
            "proxy_bridge_speculated_turns_total",
            "counter",
            "Bridged turns of live sessions whose prompt the engine rendered (no /tokenize), checked after the call.",
            sum(b.speculated for b in bridges),
        )
        metric(
            "proxy_bridge_missed_speculations_total",
            "counter",
            "Speculative calls of live sessions whose rendering was not the bridged prompt (sampled again, bridged).",
            sum(b.missed for b in bridges),
        )
        fallbacks = Counter[str]()
        for b in bridges:
            fallbacks.update(b.fallbacks)
        lines += [
            "# HELP proxy_bridge_fallbacks_total Turns of live sessions with a sampled history not bridged, by reason.",
            "# TYPE proxy_bridge_fallbacks_total counter",
        ]
        lines += [f'proxy_bridge_fallbacks_total{{reason="{r}"}} {n}' for r, n in sorted(fallbacks.items())]
        lines += ["# HELP proxy_call_seconds Wall time of a model call.", "# TYPE proxy_call_seconds histogram"]
        cumulative = 0
        for bound, count in zip((*LATENCY_BUCKETS_S, float("inf")), self.call_latency_counts, strict=True):
            cumulative += count
            label = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'proxy_call_seconds_bucket{{le="{label}"}} {cumulative}')
        lines += [f"proxy_call_seconds_sum {self.call_latency_sum}", f"proxy_call_seconds_count {cumulative}"]
        return "\n".join(lines) + "\n"
