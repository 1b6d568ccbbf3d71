"""Packing: every row once, budget respected, contents and positions exact, utilization, determinism."""

from __future__ import annotations

import pytest
import torch

from harness_grpo.packing import Layout, pack_rows
from tests.support.rows import random_row, random_rows


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_every_row_placed_once_within_budget_with_exact_contents(layout: Layout) -> None:
    rows = random_rows()
    budget = 1024
    packing = pack_rows(rows, budget, layout=layout)
    placed = [i for mb in packing.microbatches for segs in mb.segments for i, _, _ in segs]
    assert sorted(placed) == list(range(len(rows)))
    for mb in packing.microbatches:
        assert mb.num_computed_tokens <= budget
        if layout == "packed":
            assert mb.input_ids.shape[0] == 1
        for b, segs in enumerate(mb.segments):
            for i, start, n in segs:
                row, sl = rows[i], slice(start, start + n)
                assert mb.input_ids[b, sl].tolist() == row.input_ids
                assert mb.loss_mask[b, sl].tolist() == [float(m) for m in row.loss_mask]
                assert mb.behaviour_logprobs[b, sl].tolist() == pytest.approx(row.behaviour_logprobs)
                assert mb.position_ids[b, sl].tolist() == list(range(n))
                assert mb.attention_mask[b, sl].sum().item() == n
                assert torch.all(mb.advantages[b, sl] == torch.tensor(row.advantage, dtype=torch.float32))
                assert torch.all(mb.weights[b, sl] == row.weight)
        # padding: nothing trainable, attention 0, weights 0
        assert mb.num_real_tokens == int(mb.attention_mask.sum())
        assert torch.all(mb.loss_mask[mb.attention_mask == 0] == 0)
    real = sum(len(r) for r in rows)
    assert packing.real_tokens == real
    assert packing.utilization == pytest.approx(real / sum(mb.input_ids.numel() for mb in packing.microbatches))
    assert packing.loss_normalizer == pytest.approx(sum(r.n_trainable for r in rows))


def test_padded_positions_count_through_padding() -> None:
    packing = pack_rows([random_row(5, seed=1), random_row(3, seed=2)], 100)
    (mb,) = packing.microbatches
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert packing.utilization == pytest.approx(8 / 10)


def test_padded_bins_group_similar_lengths() -> None:
    lengths = [100, 10, 90, 12, 95, 11]
    rows = [random_row(n, seed=i) for i, n in enumerate(lengths)]
    packing = pack_rows(rows, 300)
    groups = [sorted(len(rows[i]) for segs in mb.segments for i, _, _ in segs) for mb in packing.microbatches]
    assert groups == [[90, 95, 100], [10, 11, 12]]
    assert packing.utilization == pytest.approx(318 / (300 + 36))


def test_packed_first_fit_decreasing() -> None:
    rows = [random_row(n, seed=i) for i, n in enumerate([60, 50, 40, 30, 20])]
    packing = pack_rows(rows, 100, layout="packed")
    groups = [[len(rows[i]) for i, _, _ in mb.segments[0]] for mb in packing.microbatches]
    assert groups == [[60, 40], [50, 30, 20]]
    assert packing.utilization == 1.0
    assert packing.microbatches[0].position_ids.tolist() == [list(range(60)) + list(range(40))]


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_deterministic(layout: Layout) -> None:
    a = pack_rows(random_rows(seed=5), 700, layout=layout)
    b = pack_rows(random_rows(seed=5), 700, layout=layout)
    assert len(a.microbatches) == len(b.microbatches)
    for x, y in zip(a.microbatches, b.microbatches, strict=True):
        assert x.segments == y.segments
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.loss_mask, y.loss_mask)


def test_row_over_budget_raises() -> None:
    with pytest.raises(ValueError, match="max_length"):
        pack_rows([random_row(50, seed=0)], 49)
    with pytest.raises(ValueError, match="layout"):
        pack_rows([random_row(5, seed=0)], 49, layout="ragged")  # type: ignore[arg-type]
    assert pack_rows([], 10).microbatches == []
