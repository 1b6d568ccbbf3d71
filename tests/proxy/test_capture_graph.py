"""Capture graph: parent linking, masks, discarded retries, roles, order independence, complexity."""

from __future__ import annotations

import random
import re
import sys
import threading
from typing import Any, NamedTuple

import orjson
import pytest
from openenv.core.harness.training import TrainingTrace as OpenEnvTrainingTrace

from proxy import capture_graph
from proxy.capture_graph import AGENT, AUXILIARY, DISCARDED, CaptureGraph
from proxy.trace import CaptureContractError, TrainingTrace
from tests.support.counting import count_calls, python_steps

TOOLS = {
    "messages": [{"role": "user", "content": "fix it"}],
    "tools": [{"type": "function", "function": {"name": "sh"}}],
}
NO_TOOLS = {"messages": [{"role": "user", "content": "title?"}], "tools": []}
SYSTEM = list(range(1, 21))


class Call(NamedTuple):
    label: str
    prompt: list[int]
    sampled: list[int]
    logprobs: list[float] | None
    request: dict[str, Any]

    @property
    def end(self) -> list[int]:
        return self.prompt + self.sampled


def _lps(sampled: list[int]) -> list[float]:
    return [-0.01 * (t % 97) - 0.001 for t in sampled]


def _call(label: str, prompt: list[int], sampled: list[int], request: dict[str, Any] = TOOLS, lps: bool = True) -> Call:
    return Call(label, prompt, sampled, _lps(sampled) if lps else None, request)


def _add(graph: CaptureGraph, calls: list[Call]) -> dict[str, str]:
    return {
        c.label: graph.add_call(c.prompt, c.sampled, c.logprobs, c.request, {"choices": []}, {"call": c.label})
        for c in calls
    }


def _build(calls: list[Call]) -> CaptureGraph:
    graph = CaptureGraph()
    _add(graph, calls)
    return graph


def _turns(graph: CaptureGraph) -> dict[str, Any]:
    """Turns keyed by call label, with the parent as a label."""
    trace = graph.to_training_trace()
    label = {t.node_id: t.metadata["call"] for t in trace.turns}
    return {
        t.metadata["call"]: {
            "prompt": t.prompt_token_ids,
            "completion": t.completion_token_ids,
            "logps": t.per_token_logps,
            "mask": t.loss_mask,
            "role": t.metadata["role"],
            "parent": label.get(t.metadata["parent_id"]),
        }
        for t in trace.turns
    }


def _sequences(graph: CaptureGraph) -> list[tuple[Any, ...]]:
    label = {t.node_id: t.metadata["call"] for t in graph.to_training_trace().turns}
    return [
        (s.token_ids, s.loss_mask, s.logprobs, s.role, [label[n] for n in s.node_ids])
        for s in graph.training_sequences()
    ]


def _assert_valid_everywhere(graph: CaptureGraph) -> None:
    trace = graph.to_training_trace()
    assert TrainingTrace.from_json(trace.to_json()) == trace
    assert TrainingTrace.model_validate_json(trace.model_dump_json()) == trace
    OpenEnvTrainingTrace.model_validate_json(trace.model_dump_json())
    for seq in graph.training_sequences():
        assert len(seq.token_ids) == len(seq.loss_mask) == len(seq.logprobs)
        assert all(lp == 0.0 for m, lp in zip(seq.loss_mask, seq.logprobs, strict=True) if m == 0)
    orjson.dumps({"sequences": graph.training_sequences()})


def _chat(n_turns: int, first: list[int] | None = None, tool_len: int = 3) -> list[Call]:
    """An append-only chat: each prompt is the previous prompt + sample + a tool result."""
    calls, prompt = [], list(first or [*SYSTEM, 21, 22])
    for i in range(n_turns):
        sampled = [1000 + 10 * i + j for j in range(2 + i % 3)]
        calls.append(_call(f"t{i}", prompt, sampled))
        prompt = prompt + sampled + [5000 + 10 * i + j for j in range(tool_len)]
    return calls


def test_append_only_chat_is_one_path_with_exact_masks() -> None:
    calls = _chat(4)
    graph = _build(calls)
    [seq] = graph.training_sequences()
    tokens, mask, logps = list(calls[0].prompt), [0] * len(calls[0].prompt), [0.0] * len(calls[0].prompt)
    for previous, call in zip([None, *calls], calls, strict=False):
        if previous is not None:
            gap = call.prompt[len(previous.end) :]
            tokens += gap
            mask += [0] * len(gap)
            logps += [0.0] * len(gap)
        tokens += call.sampled
        mask += [1] * len(call.sampled)
        logps += call.logprobs
    assert (seq.token_ids, seq.loss_mask, seq.logprobs, seq.role) == (tokens, mask, logps, AGENT)
    turns = _turns(graph)
    assert [turns[c.label]["parent"] for c in calls] == [None, "t0", "t1", "t2"]
    for call in calls:
        turn = turns[call.label]
        assert turn["prompt"] == call.prompt and turn["completion"] == call.sampled
        assert turn["mask"] == [0] * len(call.prompt) + [1] * len(call.sampled)
        assert turn["logps"] == call.logprobs and turn["role"] == AGENT
    _assert_valid_everywhere(graph)


def test_node_ids_are_12_hex_and_arrival_index_recorded() -> None:
    graph = CaptureGraph()
    ids = _add(graph, _chat(3))
    assert all(re.fullmatch(r"[0-9a-f]{12}", node_id) for node_id in ids.values())
    assert [t.metadata["index"] for t in graph.to_training_trace().turns] == [0, 1, 2]
    assert len(graph) == 3


def test_rewritten_prefix_starts_a_new_root() -> None:
    chat = _chat(3)
    compacted = _call("c0", [*SYSTEM, 900, 901], [902, 903])  # the history replaced by a summary
    after = _call("c1", [*compacted.end, 904], [905])
    think_dropped = _call("x", [*chat[1].prompt[:22], *chat[1].prompt[23:]], [906])  # one token removed
    graph = _build([*chat, compacted, after, think_dropped])
    turns = _turns(graph)
    assert turns["c0"]["parent"] is None and turns["c1"]["parent"] == "c0"
    assert turns["x"]["parent"] is None
    seqs = _sequences(graph)
    assert sorted(s[4] for s in seqs) == [["c0", "c1"], ["t0", "t1", "t2"], ["x"]]
    assert {s[3] for s in seqs} == {AGENT}


def test_retried_first_call_is_discarded_when_the_other_continued() -> None:
    first = _call("r1", [*SYSTEM, 30], [31, 32])
    retry = _call("r2", [*SYSTEM, 30], [33])
    follow = _call("r3", [*retry.end, 34], [35])
    graph = _build([first, retry, follow])
    turns = _turns(graph)
    assert turns["r1"]["role"] == DISCARDED and turns["r1"]["parent"] is None
    assert (turns["r2"]["role"], turns["r3"]["role"], turns["r3"]["parent"]) == (AGENT, AGENT, "r2")
    assert [(s[3], s[4]) for s in _sequences(graph)] == [(AGENT, ["r2", "r3"]), (DISCARDED, ["r1"])]


def test_retried_mid_call_is_discarded_and_shared_prefix_supervised_once() -> None:
    a = _call("a", [*SYSTEM, 30], [31, 32])
    b_bad = _call("b_bad", [*a.end, 40], [41])
    b = _call("b", [*a.end, 40], [42, 43])
    c = _call("c", [*b.end, 44], [45])
    graph = _build([a, b_bad, b, c])
    seqs = _sequences(graph)
    assert [(s[3], s[4]) for s in seqs] == [(AGENT, ["a", "b", "c"]), (DISCARDED, ["a", "b_bad"])]
    discarded = seqs[1]
    assert discarded[1] == [0] * len(a.end) + [0] + [1]  # `a` is trained in the agent sequence only
    assert discarded[2][-1] == b_bad.logprobs[0] and set(discarded[2][:-1]) == {0.0}
    assert _turns(graph)["a"]["mask"] == [0] * len(a.prompt) + [1, 1]


def test_all_terminal_siblings_are_kept() -> None:
    a = _call("a", [*SYSTEM, 30], [31])
    b1 = _call("b1", [*a.end, 40], [41])
    b2 = _call("b2", [*a.end, 40], [42])
    x1 = _call("x1", [500, 501], [502])
    x2 = _call("x2", [500, 501], [503])
    calls = [a, b1, b2, x1, x2]
    graph = _build(calls)
    turns = _turns(graph)
    assert {label: t["role"] for label, t in turns.items()} == dict.fromkeys(("a", "b1", "b2", "x1", "x2"), AGENT)
    seqs = _sequences(graph)
    assert len(seqs) == 4 and {s[3] for s in seqs} == {AGENT}
    trained = sum(sum(s[1]) for s in seqs)
    assert trained == sum(len(c.sampled) for c in calls)  # each node trained exactly once


def test_ties_go_to_the_earliest_node() -> None:
    x1 = _call("x1", [*SYSTEM, 30], [31])
    x2 = _call("x2", [*SYSTEM, 30], [31])
    child = _call("c", [*x1.end, 40], [41])
    for order in ([x1, x2, child], [child, x1, x2], [x1, child, x2]):
        turns = _turns(_build(order))
        assert turns["c"]["parent"] == "x1"
        assert (turns["x2"]["role"], turns["x1"]["role"]) == (DISCARDED, AGENT)


def test_none_logprobs_are_context() -> None:
    a = _call("a", [*SYSTEM, 30], [31, 32])
    b = _call("b", [*a.end, 40], [41, 42], lps=False)
    c = _call("c", [*b.end, 43], [44])
    graph = _build([a, b, c])
    turns = _turns(graph)
    assert turns["b"]["mask"] == [0] * (len(b.prompt) + 2) and turns["b"]["logps"] == [0.0, 0.0]
    [seq] = graph.training_sequences()
    start = len(b.prompt)
    assert seq.loss_mask[start : start + 2] == [0, 0] and seq.logprobs[start : start + 2] == [0.0, 0.0]
    assert seq.loss_mask[-1] == 1 and sum(seq.loss_mask) == 3
    _assert_valid_everywhere(graph)


def test_toolless_side_call_is_auxiliary_when_the_agent_sends_tools() -> None:
    title = _call("title", [7, 8, 9], [10], request=NO_TOOLS)
    graph = _build([*_chat(2), title])
    roles = {label: t["role"] for label, t in _turns(graph).items()}
    assert roles == {"t0": AGENT, "t1": AGENT, "title": AUXILIARY}
    assert [s[3] for s in _sequences(graph)] == [AGENT, AUXILIARY]


def test_without_any_tool_manifest_every_live_path_is_agent() -> None:
    rerendered = [_call(f"r{i}", [3, 100 + i, *range(200, 205 + i)], [900 + i], request=NO_TOOLS) for i in range(4)]
    graph = _build([*rerendered, _call("side", [7, 8], [9], request={})])
    turns = _turns(graph)
    assert all(t["parent"] is None and t["role"] == AGENT for t in turns.values())


def _rich() -> list[Call]:
    a = _call("a", [*SYSTEM, 21, 22], [30, 31])
    b = _call("b", [*a.end, 40, 41], [32, 33])
    b_retry = _call("b_retry", [*a.end, 40, 41], [34])
    c = _call("c", [*b.end, 42], [35], lps=False)
    d = _call("d", [*c.end, 43], [36, 37])
    e = _call("e", [*c.end, 44], [38])
    f = _call("f", [*SYSTEM, 90, 91], [92])
    g = _call("g", [*f.end, 93], [94])
    title = _call("title", [200, 201, 202], [203], request=NO_TOOLS)
    r1 = _call("r1", [300, 301], [302])
    r2 = _call("r2", [300, 301], [303])
    r3 = _call("r3", [*r2.end, 304], [305])
    return [a, b, b_retry, c, d, e, f, g, title, r1, r2, r3]


def test_arrival_order_does_not_change_the_exports() -> None:
    calls = _rich()
    graph = _build(calls)
    expected_turns, expected_seqs = _turns(graph), _sequences(graph)
    assert expected_turns["b_retry"]["role"] == DISCARDED and expected_turns["r1"]["role"] == DISCARDED
    assert expected_turns["title"]["role"] == AUXILIARY
    assert (expected_turns["d"]["parent"], expected_turns["e"]["parent"]) == ("c", "c")
    orders = [list(reversed(calls))] + [random.Random(seed).sample(calls, len(calls)) for seed in range(30)]
    for order in orders:
        graph = _build(order)
        assert _turns(graph) == expected_turns
        assert _sequences(graph) == expected_seqs
    _assert_valid_everywhere(graph)


def test_late_ancestor_adopts_orphans() -> None:
    calls = _chat(5)
    graph = _build([calls[4], calls[2], calls[0], calls[3], calls[1]])
    assert [t["parent"] for t in map(_turns(graph).get, ("t0", "t1", "t2", "t3", "t4"))] == [
        None,
        "t0",
        "t1",
        "t2",
        "t3",
    ]
    [seq] = graph.training_sequences()
    assert seq.token_ids == calls[4].end


def _random_session(rng: random.Random, n_calls: int) -> list[Call]:
    """Extensions, retries, exact duplicates, truncations, re-renders and fresh roots over a tiny vocabulary.

    Prompts start with a 40-token header, so a re-render (its first token flipped) shares the
    fingerprinted tail of the history it re-renders.
    """
    calls: list[Call] = []
    for i in range(n_calls):
        kind = rng.random()
        base = rng.choice(calls) if calls else None
        if base is None or kind < 0.1:
            prompt = [rng.randrange(2)] + [7] * 39 + [rng.randrange(3) for _ in range(rng.randint(1, 3))]
        elif kind < 0.25:
            prompt = base.prompt  # a retry of `base`
        elif kind < 0.35:
            prompt = base.end[: rng.randint(1, len(base.end))]  # a prefix of something seen
        elif kind < 0.45:
            prompt = [1 - base.end[0], *base.end[1:], rng.randrange(3)]  # a re-rendered history
        else:
            prompt = base.end + [rng.randrange(3) for _ in range(rng.randint(0, 2))]
        if base is not None and kind < 0.17:
            sampled = base.sampled
        else:
            sampled = [rng.randrange(3) for _ in range(rng.randint(0, 2))]
        calls.append(_call(f"c{i}", list(prompt), list(sampled), lps=rng.random() < 0.8))
    return calls


def _reference_parents(order: list[Call]) -> dict[str, str | None]:
    """The rule, by brute force: longest end that prefixes the prompt from a shorter prompt; earliest on ties."""
    parents: dict[str, str | None] = {}
    for call in order:
        best = None
        for other in order:
            fits = len(other.prompt) < len(call.prompt) and call.prompt[: len(other.end)] == other.end
            if other is not call and fits and (best is None or len(other.end) > len(best.end)):
                best = other
        parents[call.label] = best.label if best is not None else None
    return parents


@pytest.mark.parametrize("seed", range(40))
def test_parents_match_the_rule_for_any_arrival_order(seed: int) -> None:
    rng = random.Random(seed)
    order = rng.sample(calls := _random_session(rng, 25), len(calls))
    graph = _build(order)
    turns = _turns(graph)
    assert {label: t["parent"] for label, t in turns.items()} == _reference_parents(order)
    by_label = {c.label: c for c in calls}
    for label, turn in turns.items():
        assert (turn["prompt"], turn["completion"]) == (by_label[label].prompt, by_label[label].sampled)
    ends = sorted(tuple(s.token_ids) for s in graph.training_sequences())
    leaves = {label for label in turns} - {t["parent"] for t in turns.values()}
    assert ends == sorted(tuple(by_label[label].end) for label in leaves)
    _assert_valid_everywhere(graph)


def test_rerendered_history_with_a_matching_tail_still_finds_the_true_parent() -> None:
    body = list(range(100, 160))
    short = _call("short", [7, *body[:10]], [500])
    other = _call("other", [8, *body[:10], 500, *body[10:40]], body[40:45])  # same tail as `child` below
    child = _call("child", [*short.end, *body[10:40], *body[40:45], 600], [601])
    assert child.prompt[1 : len(other.end)] == other.end[1:]
    for order in ([short, other, child], [other, short, child], [child, other, short]):
        turns = _turns(_build(order))
        assert (turns["child"]["parent"], turns["other"]["parent"], turns["short"]["parent"]) == ("short", None, None)


BAD_CALLS = [
    pytest.param(([], [1], [-0.1]), "no_prompt_ids", id="empty_prompt"),
    pytest.param(([1, -2], [3], [-0.1]), "invalid_token_id", id="negative_prompt_id"),
    pytest.param(([1, 2], [3, True], [-0.1, -0.1]), "invalid_token_id", id="bool_sampled_id"),
    pytest.param(([1, 2], [3.0], [-0.1]), "invalid_token_id", id="float_sampled_id"),
    pytest.param(([1, [2]], [3], [-0.1]), "invalid_token_id", id="unhashable_prompt_id"),
    pytest.param(([1, 2], [3, 4], [-0.1]), "logprob_misalign", id="short_logprobs"),
    pytest.param(([1, 2], [3], [float("nan")]), "invalid_logprob", id="nan"),
    pytest.param(([1, 2], [3], [True]), "invalid_logprob", id="bool_logprob"),
    pytest.param(([1, 2], [3], [0.25]), "positive_logprob", id="positive"),
]


@pytest.mark.parametrize(("args", "code"), BAD_CALLS)
def test_capture_boundary_rejects(args: tuple[Any, ...], code: str) -> None:
    graph = _build(_chat(1))
    with pytest.raises(CaptureContractError) as caught:
        graph.add_call(*args)
    assert caught.value.code == code
    assert len(graph) == 1


def test_capture_boundary_checks_new_prompt_tokens_after_the_parent() -> None:
    [call] = _chat(1)
    graph = _build([call])
    with pytest.raises(CaptureContractError, match=rf"invalid_token_id at prompt_ids\[{len(call.end) + 1}\]"):
        graph.add_call([*call.end, 5, -5], [6], [-0.1])


def test_capture_boundary_rejects_bad_dicts_and_ids() -> None:
    graph = CaptureGraph()
    with pytest.raises(CaptureContractError, match="reserved_metadata"):
        graph.add_call([1], [2], [-0.1], {}, {}, {"role": "agent"})
    with pytest.raises(CaptureContractError, match="invalid_field"):
        graph.add_call([1], [2], [-0.1], [], {}, {})
    node_id = graph.add_call([1], [2], [-1], node_id="fixed")
    assert node_id == "fixed"
    assert graph.to_training_trace().turns[0].per_token_logps == [-1.0]
    with pytest.raises(CaptureContractError, match="invalid_node_id"):
        graph.add_call([1], [3], [-0.1], node_id="fixed")
    assert len(graph) == 1


def test_empty_completion_is_recorded() -> None:
    graph = CaptureGraph()
    graph.add_call([1, 2], [], [])
    graph.add_call([1, 2, 3], [4], None)
    _assert_valid_everywhere(graph)
    assert [t.loss_mask for t in graph.to_training_trace().turns] == [[0, 0], [0, 0, 0, 0]]


def _export_while_adding(calls: list[Call]) -> tuple[CaptureGraph, int, list[BaseException]]:
    """Add ``calls`` here while a worker thread exports in a loop; returns the graph, how many exports
    saw calls added while they ran, and what the worker raised (each export checks its snapshot)."""
    graph = CaptureGraph()
    final = calls[-1].end
    failures: list[BaseException] = []
    overlapped = 0
    started, done = threading.Event(), threading.Event()

    def export_loop() -> None:
        nonlocal overlapped
        try:
            while not done.is_set():
                before = len(graph)
                trace = graph.to_training_trace()
                sequences = graph.training_sequences()
                overlapped += len(graph) > before
                # An append-only chat: any consistent snapshot is one path, a prefix of the final one
                # (the sequences are taken after the trace, from a snapshot at least as large).
                assert len(sequences) == 1 if trace.turns else len(sequences) <= 1
                assert all(s.token_ids == final[: len(s.token_ids)] for s in sequences)
                started.set()
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
        finally:
            started.set()

    worker = threading.Thread(target=export_loop)
    worker.start()
    try:
        assert started.wait(30), "the exporting thread did not start"
        _add(graph, calls)
    finally:
        done.set()
        worker.join(30)
    return graph, overlapped, failures


def test_export_while_adding_from_another_thread() -> None:
    calls = _chat(200)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the GIL over often, so the threads interleave finely
    overlapped = 0
    try:
        for _ in range(200):  # until 30 exports overlapped the adds (a few per session: ~10 sessions)
            graph, overlaps, failures = _export_while_adding(calls)
            assert not failures, failures
            overlapped += overlaps
            if overlapped >= 30:
                break
        else:
            pytest.fail(f"only {overlapped} exports ran while calls were being added")
    finally:
        sys.setswitchinterval(interval)
    [seq] = graph.training_sequences()
    assert seq.token_ids == calls[-1].end


def _long_session(n_turns: int, step: int = 200, sampled: int = 50) -> list[Call]:
    rng = random.Random(n_turns)
    calls, prompt = [], [rng.randrange(150_000) for _ in range(1_000)]
    for i in range(n_turns):
        out = [rng.randrange(150_000) for _ in range(sampled)]
        calls.append(Call(f"t{i}", prompt, out, [-rng.random() for _ in out], TOOLS))
        prompt = prompt + out + [rng.randrange(150_000) for _ in range(step - sampled)]
    return calls


def _ingest_and_export(calls: list[Call]) -> tuple[CaptureGraph, list[str]]:
    graph = CaptureGraph()
    ids = [graph.add_call(c.prompt, c.sampled, c.logprobs, c.request, {}, {}) for c in calls]
    graph.training_sequences()
    graph.to_training_trace()
    return graph, ids


def test_256_turn_session_probes_once_per_call_and_stores_each_token_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The complexity the module promises for an append-only chat (timings: ``bench/trace_export.py``)."""
    calls = _long_session(256)
    verifications = count_calls(monkeypatch, capture_graph, "_is_prefix")
    rescans = count_calls(monkeypatch, capture_graph, "_prefix_crcs")
    graph, ids = _ingest_and_export(calls)
    # Parent lookup: one candidate per call, verified exactly once; no false candidate, no CRC rescan;
    # in-order arrival re-adopts nothing.
    assert verifications.n == len(calls) - 1 and rescans.n == 0
    # Storage: each node keeps only the ids after its parent's end, so the graph holds the session's
    # distinct tokens once, not the sum of its prompts.
    deltas = [graph.prompt_delta(node_id) for node_id in ids]
    assert [parent for parent, _ in deltas] == [None, *ids[:-1]]
    assert sum(len(new) for _, new in deltas) + sum(len(c.sampled) for c in calls) == len(calls[-1].end)
    sequences = graph.training_sequences()
    trace = graph.to_training_trace()
    assert len(sequences) == 1 and sequences[0].token_ids == calls[-1].end
    assert trace.turns[-1].prompt_token_ids == calls[-1].prompt


def test_a_parent_the_caller_checked_is_not_compared_again_and_a_longer_one_still_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``extends``: the bridge checked a speculative call's prompt against its matched turn (``CaptureGraph.extends``),
    so recording it does not compare those ids a second time; the parent is still the longest prefix."""
    t0, t1, t2 = _chat(3)
    graph = CaptureGraph()
    ids = _add(graph, [t0, t1])
    assert graph.extends(ids["t0"], t2.prompt) and graph.extends(ids["t1"], t2.prompt)
    assert not graph.extends(ids["t1"], t1.prompt) and not graph.extends(ids["t1"], [*t1.end[:-1], 1, *t2.prompt])
    verifications = count_calls(monkeypatch, capture_graph, "_is_prefix")
    ids["t2"] = graph.add_call(
        t2.prompt, t2.sampled, t2.logprobs, TOOLS, {"choices": []}, {"call": "t2"}, extends=ids["t1"]
    )
    assert verifications.n == 0 and graph.prompt_delta(ids["t2"])[0] == ids["t1"]
    # A caller's node shorter than the best parent: the longer one is found (and compared) as without it.
    t3 = _call("t3", [*t2.end, 7000], [7001, 7002])
    node = graph.add_call(t3.prompt, t3.sampled, t3.logprobs, TOOLS, {"choices": []}, {"call": "t3"}, extends=ids["t0"])
    assert verifications.n == 1 and graph.prompt_delta(node)[0] == ids["t2"]
    assert graph.prompt_ids(node) == t3.prompt and graph.end_ids(node) == t3.end
    _assert_valid_everywhere(graph)


def test_python_work_of_ingestion_and_export_does_not_grow_with_tokens() -> None:
    """Per-token work runs in C (slices, hashes, CRCs, list products): the Python lines run to
    ingest and export a 64-turn chat are the same for 5 and for 500 sampled tokens per turn."""
    sessions = {
        (step, sampled): _long_session(64, step, sampled) for step, sampled in [(20, 5), (200, 50), (2000, 500)]
    }
    counts = {shape: python_steps(lambda c=calls: _ingest_and_export(c))[1] for shape, calls in sessions.items()}
    assert min(counts.values()) >= 64 * 3  # add_call and its helpers are Python: the count sees them
    assert len(set(counts.values())) == 1, counts


def test_sequences_from_trace_matches_graph_and_keeps_partial_masks() -> None:
    from proxy.capture_graph import sequences_from_trace

    graph = CaptureGraph()
    graph.add_call([10, 11], [12, 13, 14], [-0.1, -0.2, -0.3])
    graph.add_call([10, 11, 12, 13, 14, 15], [16, 17], [-0.4, -0.5])
    graph.add_call([20, 21], [22], [-0.6])  # a second root (a rewrite)
    trace = graph.to_training_trace()
    rebuilt = sequences_from_trace(trace)
    assert [(s.token_ids, s.loss_mask, s.logprobs, s.role) for s in rebuilt] == [
        (s.token_ids, s.loss_mask, s.logprobs, s.role) for s in graph.training_sequences()
    ]
    # A producer that masks a token inside a completion (REFERENCE §2.2: train 12 and 14, keep 13 as context).
    data = trace.model_dump()
    first = next(t for t in data["turns"] if t["prompt_token_ids"] == [10, 11])
    first["loss_mask"] = [0, 0, 1, 0, 1]
    partial = sequences_from_trace(TrainingTrace.model_validate(data))
    path = next(s for s in partial if s.token_ids[:2] == [10, 11])
    assert path.loss_mask == [0, 0, 1, 0, 1, 0, 1, 1]
    assert path.logprobs == [0.0, 0.0, -0.1, 0.0, -0.3, 0.0, -0.4, -0.5]


@pytest.mark.parametrize("seed", range(20))
def test_trace_json_is_the_bytes_of_the_model_serialised(seed: int) -> None:
    """Random graphs (branches, retries, re-renders, out-of-order arrival, calls without logprobs, empty
    completions, requests of the proxy's shape with shared messages and of other shapes)."""
    rng = random.Random(seed)
    shared = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    requests = [TOOLS, NO_TOOLS, {"messages": shared, "tools": []}, {"messages": [*shared, shared[0]], "tools": []}]
    requests.append({"tools": [], "messages": shared, "extra": 1})  # not the proxy's shape
    calls = [c._replace(request=rng.choice(requests)) for c in _random_session(rng, 25)]
    graph = _build(rng.sample(calls, len(calls)))
    assert graph.trace_json() == graph.to_training_trace().to_json()
    assert CaptureGraph().trace_json() == CaptureGraph().to_training_trace().to_json()


def test_trace_json_serialises_each_token_and_message_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 128-turn agent chat: the served trace repeats every prompt and history (O(turns x history) bytes),
    but what orjson serialises is each node's new tokens, messages and dicts, a small fraction of it."""
    serialised = 0

    def counting_dumps(value: Any) -> bytes:
        nonlocal serialised
        data = orjson.dumps(value)
        serialised += len(data)
        return data

    rng = random.Random(0)
    graph, prompt, history = CaptureGraph(), SYSTEM * 50, [{"role": "system", "content": "x" * 4000}]
    for turn in range(128):
        history.append({"role": "tool", "content": f"result {turn}"})
        sampled = [rng.randrange(32000) for _ in range(50)]
        graph.add_call(prompt, sampled, _lps(sampled), {"messages": list(history), "tools": []}, {}, {})
        prompt = prompt + sampled + [rng.randrange(32000) for _ in range(150)]
    monkeypatch.setattr(capture_graph, "orjson", type("Counting", (), {"dumps": staticmethod(counting_dumps)}))
    data = graph.trace_json()
    assert len(data) > 10_000_000
    assert serialised < len(data) / 20
