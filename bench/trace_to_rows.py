"""Trace-to-rows: what the trainer does with one step's traces, for 64 sessions of 32 turns.

Each session is recorded as the proxy records it (``CaptureGraph.add_call`` per engine call) and
exported as the JSON the trainer fetches (``GET /sessions/{id}/trace``). A session is an agent
chat: a ``--first``-token first prompt, then each call's prompt extends the previous one by its
``--sampled`` sampled tokens plus ``--tool`` tokens of tool result; one session in eight compacts
its history halfway (a new root, so two rows). Timed per phase, over all sessions (best of
``--repeats``):

- parse: ``TrainingTrace.from_json`` (the trace validated on the way in);
- sequences: ``sequences_from_trace``, which follows the ``parent_id`` links the proxy wrote into
  every turn (each link checked to be an exact token prefix); beside it, ``rebuilt_sequences``, the
  second capture graph the trainer built from the trace before it read the links (still the path
  for a foreign trace without links);
- rows: ``rollout_rows`` (one row per sequence, token weighting).

Side by side, the same traces through OpenEnv 0.10.0: ``TrainingTrace.model_validate_json`` and
``RolloutGraph.sequences()``; and the per-turn layout (one row per call, as trainers that train
each turn separately do), whose row tokens show what merging paths saves in the optimizer.

    .venv/bin/python -m bench.trace_to_rows [--sessions 64] [--turns 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import random
from typing import Any

from openenv.core.harness.capture.graph import RolloutGraph, TurnNode
from openenv.core.harness.training import TrainingTrace as OpenEnvTrainingTrace

from bench.trace_export import best_ms
from harness_grpo.rows import RowStats, rollout_rows
from proxy.capture_graph import CaptureGraph, rebuilt_sequences, sequences_from_trace
from proxy.trace import TrainingTrace

TOOLS = {"messages": [], "tools": [{"type": "function", "function": {"name": "sh"}}]}
VOCAB = 150_000


def session_json(seed: int, turns: int, first: int, sampled: int, tool: int) -> bytes:
    """One session recorded through ``CaptureGraph`` and exported as trace JSON."""
    rng = random.Random(seed)
    graph = CaptureGraph()
    prompt = [rng.randrange(VOCAB) for _ in range(first)]
    compact_at = turns // 2 if seed % 8 == 0 else None
    for turn in range(turns):
        if turn == compact_at:  # a summary replaces the history: a new root
            prompt = prompt[:first] + [rng.randrange(VOCAB) for _ in range(200)]
        out = [rng.randrange(VOCAB) for _ in range(sampled)]
        graph.add_call(prompt, out, [-rng.random() for _ in out], TOOLS, {}, {})
        prompt = prompt + out + [rng.randrange(VOCAB) for _ in range(tool)]
    return graph.to_training_trace().to_json()


def ours(traces: list[TrainingTrace]) -> list[list[Any]]:
    return [sequences_from_trace(trace) for trace in traces]


def rows_of(all_sequences: list[list[Any]]) -> list[Any]:
    stats = RowStats()
    rows = []
    for i, sequences in enumerate(all_sequences):
        rows += rollout_rows(sequences, 1.0, policy_version=0, rollout_id=f"r{i}", group_id=f"g{i // 8}", stats=stats)
    return rows


def openenv_sequences(traces: list[OpenEnvTrainingTrace]) -> list[list[Any]]:
    out = []
    for trace in traces:
        graph = RolloutGraph()
        for turn in trace.turns:
            graph.add_turn(
                TurnNode(
                    node_id=turn.node_id,
                    prompt_ids=list(turn.prompt_token_ids),
                    sampled_ids=list(turn.completion_token_ids),
                    sampled_logprobs=turn.per_token_logps[-len(turn.completion_token_ids) :],
                    n_tools=1,
                )
            )
        out.append(graph.sequences())
    return out


def per_turn_rows(traces: list[TrainingTrace]) -> list[tuple[list[int], list[int]]]:
    """One row per call: prompt + completion ids, mask 0 over the prompt and 1 over the completion."""
    rows = []
    for trace in traces:
        for turn in trace.turns:
            n_prompt = len(turn.prompt_token_ids)
            rows.append((turn.prompt_token_ids + turn.completion_token_ids, [0] * n_prompt + turn.loss_mask[n_prompt:]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=32)
    parser.add_argument("--first", type=int, default=2000, help="tokens of the first prompt")
    parser.add_argument("--sampled", type=int, default=60, help="sampled tokens per call")
    parser.add_argument("--tool", type=int, default=200, help="tool-result tokens between calls")
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args()

    blobs = [session_json(s, a.turns, a.first, a.sampled, a.tool) for s in range(a.sessions)]
    parse_ms, traces = best_ms(lambda: [TrainingTrace.from_json(b) for b in blobs], a.repeats)
    seq_ms, sequences = best_ms(lambda: ours(traces), a.repeats)
    rebuilt_ms, rebuilt = best_ms(lambda: [rebuilt_sequences(trace) for trace in traces], a.repeats)
    assert [[s.token_ids for s in seqs] for seqs in rebuilt] == [[s.token_ids for s in seqs] for seqs in sequences]
    rows_ms, rows = best_ms(lambda: rows_of(sequences), a.repeats)
    oe_parse_ms, oe_traces = best_ms(lambda: [OpenEnvTrainingTrace.model_validate_json(b) for b in blobs], a.repeats)
    oe_seq_ms, oe_sequences = best_ms(lambda: openenv_sequences(oe_traces), a.repeats)
    turn_ms, turn_rows = best_ms(lambda: per_turn_rows(traces), a.repeats)

    trace_tokens = sum(len(t.prompt_token_ids) + len(t.completion_token_ids) for tr in traces for t in tr.turns)
    row_tokens = sum(len(r.input_ids) for r in rows)
    trained = sum(r.n_trainable for r in rows)
    turn_tokens = sum(len(ids) for ids, _ in turn_rows)
    oe_paths = sum(len(s) for s in oe_sequences)
    print(
        f"{a.sessions} sessions x {a.turns} turns (first prompt {a.first}, +{a.sampled} sampled +{a.tool} tool "
        f"tokens per turn; 1 in 8 compacts): {len(blobs[0]) / 1e6:.2f} MB of trace JSON per session, "
        f"{trace_tokens / 1e6:.1f}M prompt+completion tokens in all traces; os.cpu_count()={os.cpu_count()}"
    )
    print(f"\n{'phase (all sessions)':34}{'ours ms':>10}{'OpenEnv ms':>12}{'ratio':>8}")
    for name, mine, theirs in (
        ("parse + validate trace JSON", parse_ms, oe_parse_ms),
        ("traces -> sequences (links)", seq_ms, oe_seq_ms),
        ("traces -> sequences (2nd graph)", rebuilt_ms, oe_seq_ms),
        ("sequences -> rows", rows_ms, None),
    ):
        tail = f"{theirs:12.1f}{theirs / mine:7.1f}x" if theirs is not None else ""
        print(f"{name:34}{mine:10.1f}{tail}")
    total = parse_ms + seq_ms + rows_ms
    print(f"{'trace JSON -> rows, total':34}{total:10.1f}   ({total / a.sessions:.2f} ms per session)")
    print(f"links instead of a second graph: sequences {rebuilt_ms / seq_ms:.1f}x faster")
    print(
        f"\nrows: ours {len(rows)} rows, {row_tokens / 1e6:.2f}M tokens ({trained / 1e3:.0f}k trained); "
        f"OpenEnv's graph {oe_paths} sequences; one row per turn: {len(turn_rows)} rows, "
        f"{turn_tokens / 1e6:.1f}M tokens = {turn_tokens / row_tokens:.1f}x the tokens to run through the model "
        f"(per-turn layout built in {turn_ms:.1f} ms)"
    )


if __name__ == "__main__":
    main()
