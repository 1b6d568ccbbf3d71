"""Rows: exact masks (zeros inside a completion), one advantage per rollout, fork weighting, drops."""

from __future__ import annotations

import pytest

from harness_grpo.rows import Row, RowStats, loss_normalizer, rollout_rows
from harness_grpo.turn_masks import mask_turns
from proxy.capture_graph import AGENT, AUXILIARY, DISCARDED, CaptureGraph, TrainingSequence, sequences_from_trace

TOOLS = {"messages": [], "tools": [{"type": "function", "function": {"name": "sh"}}]}
REPLY_B = {"choices": [{"message": {"role": "assistant", "content": "b"}}]}


def _rows(sequences: list[TrainingSequence], advantage: float = 1.0, **kw: object) -> list[Row]:
    return rollout_rows(sequences, advantage, policy_version=3, rollout_id="r0", group_id="g0", **kw)  # type: ignore[arg-type]


def test_partial_mask_is_preserved_exactly() -> None:
    # REFERENCE §2.2: prompt [10,11] + completion [12,13,14], mask [0,0,1,0,1] trains 12 and 14 only
    seq = TrainingSequence([10, 11, 12, 13, 14], [0, 0, 1, 0, 1], [0.0, 0.0, -0.5, 0.0, -0.25], ["n"], AGENT)
    (row,) = _rows([seq], advantage=0.7)
    assert row.input_ids == [10, 11, 12, 13, 14]
    assert row.loss_mask == [0, 0, 1, 0, 1]
    assert row.behaviour_logprobs == [0.0, 0.0, -0.5, 0.0, -0.25]
    assert [t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m] == [12, 14]
    assert row.n_trainable == 2 and row.weight == 1.0  # token weighting by default
    assert (row.advantage, row.policy_version, row.rollout_id, row.group_id) == (0.7, 3, "r0", "g0")
    assert row.node_ids == ("n",) and row.role == AGENT
    assert seq.loss_mask == [0, 0, 1, 0, 1]  # the input is not mutated


def _forked_graph() -> tuple[CaptureGraph, list[TrainingSequence]]:
    g = CaptureGraph()
    g.add_call([1, 2, 3], [4, 5], [-0.1, -0.2], TOOLS, node_id="a")
    g.add_call([1, 2, 3, 4, 5, 6], [7, 8], [-0.3, -0.4], TOOLS, REPLY_B, node_id="b")  # continues a
    g.add_call([1, 2, 3, 4, 5, 9], [10], [-0.5], TOOLS, node_id="c")  # a fork of a, also terminal
    return g, g.training_sequences()


def test_forked_rollout_counts_once() -> None:
    _, seqs = _forked_graph()
    assert len(seqs) == 2 and all(s.role == AGENT for s in seqs)
    rows = _rows(seqs, advantage=-1.0, weighting="rollout")
    assert len(rows) == 2
    assert [r.n_trainable for r in rows] == [4, 1]  # the shared node a is trained once
    assert all(r.advantage == -1.0 for r in rows)
    assert all(r.weight == pytest.approx(1 / 5) for r in rows)
    assert loss_normalizer(rows) == pytest.approx(1.0)  # one rollout
    single = _rows([TrainingSequence([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], ["x"], AGENT)], weighting="rollout")
    assert loss_normalizer(rows + single) == pytest.approx(2.0)  # two rollouts, whatever their rows


def test_token_weighting_is_the_default_and_counts_tokens() -> None:
    _, seqs = _forked_graph()
    assert _rows(seqs) == _rows(seqs, weighting="token")
    rows = _rows(seqs)
    assert [r.weight for r in rows] == [1.0, 1.0]
    assert loss_normalizer(rows) == 5.0
    with pytest.raises(ValueError, match="weighting"):
        _rows(seqs, weighting="row")  # type: ignore[arg-type]


def test_excluded_roles_and_empty_rows_are_dropped_and_counted() -> None:
    seqs = [
        TrainingSequence([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], ["a"], AGENT),
        TrainingSequence([1, 2, 4], [0, 0, 1], [0.0, 0.0, -1.0], ["t"], AUXILIARY),
        TrainingSequence([1, 2, 5], [0, 0, 1], [0.0, 0.0, -1.0], ["d"], DISCARDED),
        TrainingSequence([1, 2, 3, 6], [0, 0, 0, 0], [0.0] * 4, ["e"], AGENT),
    ]
    stats = RowStats()
    rows = _rows(seqs, stats=stats)
    assert [r.node_ids for r in rows] == [("a",)]
    assert (stats.rows, stats.excluded_role, stats.dropped_empty) == (1, 2, 1)
    rows = _rows(seqs, include_roles=(AGENT, AUXILIARY), stats=stats, weighting="rollout")
    assert [r.role for r in rows] == [AGENT, AUXILIARY]
    assert all(r.weight == pytest.approx(1 / 3) for r in rows)
    assert stats.rollouts == 2 and stats.rows == 3 and stats.trainable_tokens == 5
    assert stats.metrics()["rows/dropped_empty"] == 2.0


def test_rows_longer_than_max_length_are_dropped_not_cut() -> None:
    seqs = [
        TrainingSequence([1, 2, 3, 4, 5], [0, 1, 1, 1, 1], [0.0, -1.0, -1.0, -1.0, -1.0], ["long"], AGENT),
        TrainingSequence([1, 2, 3], [0, 0, 1], [0.0, 0.0, -1.0], ["short"], AGENT),
    ]
    stats = RowStats()
    rows = _rows(seqs, max_length=4, stats=stats)
    assert [r.node_ids for r in rows] == [("short",)] and rows[0].weight == 1.0
    assert stats.dropped_too_long == 1
    assert _rows(seqs[:1], max_length=4, stats=stats) == [] and stats.rollouts_without_rows == 1


def test_a_turn_rule_makes_rejected_turns_context() -> None:
    """``mask_turns`` (what ``train_turn_fn`` did) zeroes the rejected turn's completion in the trace;
    the rows then keep its tokens as context in every sequence."""
    g, _ = _forked_graph()
    assert mask_turns(g.to_training_trace(), lambda turn: True) == g.to_training_trace()
    b_masked = mask_turns(g.to_training_trace(), lambda turn: turn.content != "b")
    assert {t.node_id: sum(t.loss_mask) for t in b_masked.turns} == {"a": 2, "b": 0, "c": 1}
    rows = _rows(sequences_from_trace(b_masked), weighting="rollout")
    assert [r.n_trainable for r in rows] == [2, 1]
    assert rows[0].loss_mask == [0, 0, 0, 1, 1, 0, 0, 0]
    assert rows[0].behaviour_logprobs == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, 0])
    assert all(r.weight == pytest.approx(1 / 3) for r in rows)


@pytest.mark.parametrize(
    ("ids", "mask", "logps", "match"),
    [
        ([1, 2, 3], [0, 1], [0.0, -1.0, -1.0], "equal"),
        ([1, 2, 3], [0, 1, 1], [0.0, -1.0], "equal"),
        ([1, 2, 3], [0, 2, 1], [0.0, -1.0, -1.0], "0 or 1"),
        ([1, 2, 3], [1, 1, 1], [-1.0, -1.0, -1.0], "position 0"),
    ],
)
def test_row_validation(ids: list[int], mask: list[int], logps: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Row(ids, mask, logps, advantage=1.0, weight=1.0, policy_version=0, rollout_id="r", group_id="g")


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_each_calls_completion_trains_with_its_own_turn_advantage(layout: str) -> None:
    from harness_grpo.packing import pack_rows
    from harness_grpo.rows import call_spans

    g = CaptureGraph()
    g.add_call([1, 2, 3], [4, 5], [-0.1, -0.2], TOOLS, node_id="a")
    g.add_call([1, 2, 3, 4, 5, 6], [7, 8], [-0.3, -0.4], TOOLS, REPLY_B, node_id="b")  # a tool result (6), then b
    g.add_call([1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11], [-0.5, -0.6], TOOLS, node_id="c")
    trace = g.to_training_trace()
    spans = call_spans(trace.to_trace_entries(), [0.5, 0.0, -2.0])
    assert spans == {"a": (3, 5, 0.5), "c": (9, 11, -2.0)}  # a call with no turn credit is left out
    (row,) = _rows(sequences_from_trace(trace), advantage=1.0, turn_advantages=spans)
    assert row.turn_advantages == ((3, 5, 0.5), (9, 11, -2.0)) and row.has_signal
    (batch,) = pack_rows([row, *_rows(sequences_from_trace(trace), advantage=0.25)], 64, layout=layout).microbatches
    for b, segments in enumerate(batch.segments):
        for index, start, n in segments:
            advantages = batch.advantages[b, start : start + n].tolist()
            trained = [a for a, m in zip(advantages, batch.loss_mask[b, start : start + n].tolist(), strict=True) if m]
            assert trained == ([1.5, 1.5, 1.0, 1.0, -1.0, -1.0] if index == 0 else [0.25] * 6)
    cancelled = _rows(sequences_from_trace(trace), advantage=0.0, turn_advantages={"b": (6, 8, 0.0)})
    assert not cancelled[0].has_signal
    with pytest.raises(ValueError, match="3 model calls"):
        call_spans(trace.to_trace_entries(), [1.0])
    with pytest.raises(ValueError, match="turn advantage span"):
        _rows(sequences_from_trace(trace), turn_advantages={"a": (3, 40, 1.0)})
