"""Capture-graph ingestion and trace export, side by side with OpenEnv 0.10.0's RolloutGraph.

Each session is an append-only agent chat: a 1,000-token first prompt, then every call's prompt
extends the previous one by its 50 sampled tokens plus a 150-token tool result (256 turns: a
~52k-token final prompt). The served trace (`GET /sessions/{id}/trace`) is timed both ways: the
model then `to_json`, and `trace_json`, which splices each segment's bytes; also for the same calls
carrying the requests an agent sends (a 6.4k-character system prompt, a bash tool, a ~200-character
message per call, messages shared across turns as a proxy session stores them). A second shape
re-renders the history on every call (terminus-2), so every call is a new root. Times are the best
of `--repeats` runs, in milliseconds. Retained memory is what a graph keeps (list storage, traced)
when every call's ids arrive as fresh lists, as they do from the engine's JSON.

    .venv/bin/python -m bench.trace_export [--turns 64 128 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from openenv.core.harness.capture.graph import RolloutGraph, TurnNode
from openenv.core.harness.training import TrainingTrace as OpenEnvTrainingTrace

from proxy.capture_graph import CaptureGraph
from proxy.trace import TrainingTrace

Call = tuple[list[int], list[int], list[float]]
TOOLS = {"messages": [], "tools": [{"type": "function", "function": {"name": "sh"}}]}
AGENT_TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run one shell command.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]  # fmt: skip


def session(n_turns: int, first: int = 1_000, sampled: int = 50, tool: int = 150) -> list[Call]:
    """An append-only chat of `n_turns` calls with random ids and logprobs."""
    rng = random.Random(n_turns)
    calls, prompt = [], [rng.randrange(150_000) for _ in range(first)]
    for _ in range(n_turns):
        out = [rng.randrange(150_000) for _ in range(sampled)]
        calls.append((prompt, out, [-rng.random() for _ in out]))
        prompt = prompt + out + [rng.randrange(150_000) for _ in range(tool)]
    return calls


def agent_requests(n_turns: int) -> list[dict[str, Any]]:
    """Each call's request as a proxy session keeps it: a growing history whose message objects are shared."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful engineer. " * 229}]
    requests = []
    for turn in range(n_turns):
        history.append({"role": "tool" if turn else "user", "content": f"result {turn}: " + "ok " * 64})
        requests.append({"messages": list(history), "tools": AGENT_TOOLS})
        history.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{turn}", "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "pytest -x"}'}}]})  # fmt: skip
    return requests


def rerendered(calls: list[Call]) -> list[Call]:
    """The same calls with one early token changed per call, so no prompt extends another."""
    return [([*prompt[:10], 150_000 + i, *prompt[11:]], out, lps) for i, (prompt, out, lps) in enumerate(calls)]


def retained_mb(build: Callable[[list[Call]], Any], calls: list[Call]) -> float:
    """Traced memory a graph keeps after ingesting copies of `calls` (the copies are otherwise dropped)."""
    tracemalloc.start()
    graph = build([(list(p), list(o), list(lps)) for p, o, lps in calls[:1]])
    for call in calls[1:]:
        add_one(graph, (list(call[0]), list(call[1]), list(call[2])))
    retained = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return retained / 1e6


def add_one(graph: CaptureGraph | RolloutGraph, call: Call) -> None:
    prompt, out, lps = call
    if isinstance(graph, CaptureGraph):
        graph.add_call(prompt, out, lps, TOOLS, {}, {})
    else:
        graph.add_turn(TurnNode(node_id=f"n{len(graph.nodes())}", prompt_ids=prompt, sampled_ids=out,
                                sampled_logprobs=lps, n_tools=1))  # fmt: skip


def best_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Best wall time of `repeats` calls, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3, result


def ours_add(calls: list[Call]) -> CaptureGraph:
    graph = CaptureGraph()
    for call in calls:
        add_one(graph, call)
    return graph


def openenv_add(calls: list[Call]) -> RolloutGraph:
    graph = RolloutGraph()
    for call in calls:
        add_one(graph, call)
    return graph


def run(n_turns: int, repeats: int) -> None:
    calls = session(n_turns)
    add_ms, graph = best_ms(lambda: ours_add(calls), repeats)
    oe_add_ms, oe_graph = best_ms(lambda: openenv_add(calls), repeats)
    seq_ms, _ = best_ms(graph.training_sequences, repeats)
    oe_seq_ms, _ = best_ms(oe_graph.sequences, repeats)
    trace_ms, trace = best_ms(graph.to_training_trace, repeats)
    to_json_ms, data = best_ms(trace.to_json, repeats)
    dump_ms, _ = best_ms(trace.model_dump_json, repeats)
    from_json_ms, _ = best_ms(lambda: TrainingTrace.from_json(data), repeats)
    validate_json_ms, _ = best_ms(lambda: TrainingTrace.model_validate_json(data), repeats)
    as_dicts = trace.model_dump()
    validate_ms, _ = best_ms(lambda: TrainingTrace.model_validate(as_dicts), repeats)
    oe_validate_ms, _ = best_ms(lambda: OpenEnvTrainingTrace.model_validate(as_dicts), repeats)
    oe_validate_json_ms, _ = best_ms(lambda: OpenEnvTrainingTrace.model_validate_json(data), repeats)
    served_ms, _ = best_ms(lambda: graph.to_training_trace().to_json(), repeats)
    spliced_ms, _ = best_ms(graph.trace_json, repeats)
    agent_graph = CaptureGraph()
    for (prompt, out, lps), request in zip(calls, agent_requests(n_turns), strict=True):
        agent_graph.add_call(prompt, out, lps, request, {}, {})
    agent_served_ms, _ = best_ms(lambda: agent_graph.to_training_trace().to_json(), repeats)
    agent_spliced_ms, agent_data = best_ms(agent_graph.trace_json, repeats)
    trace_tokens = sum(len(t.prompt_token_ids) + len(t.completion_token_ids) for t in trace.turns)

    print(
        f"\n{n_turns} turns: final prompt {len(calls[-1][0])} tokens; trace holds {trace_tokens} tokens, "
        f"{len(data) / 1e6:.1f} MB of JSON"
    )
    rows = [
        ("retained memory (MB)", retained_mb(ours_add, calls), retained_mb(openenv_add, calls)),
        ("add all calls", add_ms, oe_add_ms),
        ("  per call", add_ms / n_turns, oe_add_ms / n_turns),
        ("training sequences", seq_ms, oe_seq_ms),
        ("add + sequences", add_ms + seq_ms, oe_add_ms + oe_seq_ms),
        ("to_training_trace", trace_ms, None),
        ("trace.to_json (orjson)", to_json_ms, None),
        ("trace.model_dump_json", dump_ms, None),
        ("TrainingTrace.from_json (orjson)", from_json_ms, None),
        ("served trace: model + to_json", served_ms, None),
        ("served trace: trace_json", spliced_ms, None),
        (f"  agent requests ({len(agent_data) / 1e6:.0f} MB): model+to_json", agent_served_ms, None),
        ("  agent requests: trace_json", agent_spliced_ms, None),
        ("TrainingTrace.model_validate_json", validate_json_ms, oe_validate_json_ms),
        ("TrainingTrace.model_validate (dicts)", validate_ms, oe_validate_ms),
    ]
    table(rows)

    calls = rerendered(calls)
    add_ms, graph = best_ms(lambda: ours_add(calls), repeats)
    oe_add_ms, oe_graph = best_ms(lambda: openenv_add(calls), repeats)
    seq_ms, _ = best_ms(graph.training_sequences, repeats)
    oe_seq_ms, _ = best_ms(oe_graph.sequences, repeats)
    print(f"{n_turns} turns, history re-rendered on every call ({len(graph)} roots)")
    table([("add all calls", add_ms, oe_add_ms), ("training sequences", seq_ms, oe_seq_ms)])


def table(rows: list[tuple[str, float, float | None]]) -> None:
    print(f"{'':36}{'ours':>10}{'OpenEnv':>12}{'ratio':>8}")
    for name, ours, theirs in rows:
        tail = f"{theirs:12.1f}{theirs / ours:7.1f}x" if theirs is not None else ""
        print(f"{name:36}{ours:10.1f}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for n_turns in args.turns:
        run(n_turns, args.repeats)


if __name__ == "__main__":
    main()
