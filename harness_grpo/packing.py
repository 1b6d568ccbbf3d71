"""Rows into micro-batches under a token budget, with little padding; deterministic.

Two layouts; both give every row the positions 0..len-1 it had in the engine, and both are
consumed by `harness_grpo.loss.token_logprobs`, which passes `position_ids` and NO attention mask:

  * "padded" (default): a 2D batch, rows right-padded to the longest row of the micro-batch.
    The budget counts computed tokens, padding included: rows * max_len <= budget. Rows are
    sorted by length (longest first, ties by input order) and filled next-fit: with sorted rows
    the open bin with the least padding for the next row is always the last one, so an earlier bin
    with room would only add padding (first-fit-decreasing by padded cost reduces to this).
    Pad positions continue counting (position_ids = 0..max_len-1 on every row) and no attention
    mask is passed: under a causal mask a real token never attends to a pad on its right, so the
    real tokens' logits are exactly those of the row alone, and sdpa keeps its `is_causal` kernel.
    (`attention_mask` is still provided for consumers that want it.) Attention costs
    sum over micro-batches of rows * max_len^2.
  * "packed": one 1D sequence per micro-batch (batch size 1), rows concatenated with position ids
    restarting at 0; first-fit-decreasing on real tokens (sum of lengths <= budget), no padding.
    transformers (5.x, `masking_utils.find_packed_sequence_indices`) detects the restarts when no
    attention mask and no cache are passed and builds a block-diagonal causal mask, so rows do not
    cross-attend. On CPU sdpa that mask is dense: attention costs (sum of lengths)^2 per
    micro-batch, with no causal skipping; bench/trainer_step.py measured it at half the padded
    layout's throughput (517 vs 1010 tokens/s, 8192-token budget, rows of 500-4000 tokens, 2
    shared cores) despite 100% vs 98% utilization. It is the layout for varlen kernels on GPU.

Utilization = real tokens / computed tokens (padding included). A row longer than the budget
raises ValueError: set `rollout_rows(max_length=...)` to at most the budget so it is dropped and
counted there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from harness_grpo.rows import Row, loss_normalizer

__all__ = ["Layout", "MicroBatch", "Packing", "pack_rows"]

Layout = Literal["padded", "packed"]


@dataclass(slots=True)
class MicroBatch:
    """Tensors of one forward pass, all (B, L); per-row scalars are broadcast over the row's tokens.

    `segments[b]` lists (row index into the packed `rows`, start, length) of each row in batch
    row b: one per batch row in the padded layout, several in the packed layout.
    """

    input_ids: torch.Tensor  # long
    attention_mask: torch.Tensor  # long, 1 on real tokens
    position_ids: torch.Tensor  # long
    loss_mask: torch.Tensor  # float32, 1.0 on trained tokens
    behaviour_logprobs: torch.Tensor  # float32, 0.0 where not trained
    advantages: torch.Tensor  # float32, per token: the row's advantage plus its turn spans' (rows.Row)
    weights: torch.Tensor  # float32
    segments: list[list[tuple[int, int, int]]]
    layout: Layout

    @property
    def num_real_tokens(self) -> int:
        return sum(length for segs in self.segments for _, _, length in segs)

    @property
    def num_computed_tokens(self) -> int:
        return self.input_ids.numel()


@dataclass(slots=True)
class Packing:
    """The micro-batches of one optimizer step and the step's loss normalizer."""

    microbatches: list[MicroBatch]
    loss_normalizer: float

    @property
    def real_tokens(self) -> int:
        return sum(mb.num_real_tokens for mb in self.microbatches)

    @property
    def computed_tokens(self) -> int:
        return sum(mb.num_computed_tokens for mb in self.microbatches)

    @property
    def utilization(self) -> float:
        computed = self.computed_tokens
        return self.real_tokens / computed if computed else 1.0

    def metrics(self) -> dict[str, float]:
        return {
            "packing/utilization": self.utilization,
            "packing/microbatches": float(len(self.microbatches)),
            "packing/real_tokens": float(self.real_tokens),
        }


def _bins_padded(order: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    bins: list[list[int]] = []
    for i in order:
        if bins and (len(bins[-1]) + 1) * lengths[bins[-1][0]] <= budget:
            bins[-1].append(i)
        else:
            bins.append([i])
    return bins


def _bins_packed(order: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for b, room in enumerate(free):
            if lengths[i] <= room:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(budget - lengths[i])
    return bins


def _fill(rows: Sequence[Row], batch_rows: list[list[int]], pad_token_id: int, layout: Layout) -> MicroBatch:
    width = max(sum(len(rows[i]) for i in group) for group in batch_rows)
    shape = (len(batch_rows), width)
    ids = torch.full(shape, pad_token_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    positions = torch.arange(width, dtype=torch.long).repeat(len(batch_rows), 1)
    mask = torch.zeros(shape, dtype=torch.float32)
    behaviour = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    weights = torch.zeros(shape, dtype=torch.float32)
    segments: list[list[tuple[int, int, int]]] = []
    for b, group in enumerate(batch_rows):
        start, segs = 0, []
        for i in group:
            row, n = rows[i], len(rows[i])
            end = start + n
            ids[b, start:end] = torch.tensor(row.input_ids, dtype=torch.long)
            attention[b, start:end] = 1
            positions[b, start:end] = torch.arange(n)
            mask[b, start:end] = torch.tensor(row.loss_mask, dtype=torch.float32)
            behaviour[b, start:end] = torch.tensor(row.behaviour_logprobs, dtype=torch.float32)
            advantages[b, start:end] = row.advantage
            for span_start, span_end, extra in row.turn_advantages:
                advantages[b, start + span_start : start + span_end] += extra
            weights[b, start:end] = row.weight
            segs.append((i, start, n))
            start = end
        segments.append(segs)
    return MicroBatch(ids, attention, positions, mask, behaviour, advantages, weights, segments, layout)


def pack_rows(
    rows: Sequence[Row], max_tokens_per_microbatch: int, *, layout: Layout = "padded", pad_token_id: int = 0
) -> Packing:
    """All rows of one optimizer step, each placed exactly once, in micro-batches within the budget.

    Deterministic: the same rows in the same order give the same micro-batches. Micro-batches come
    longest rows first, so a budget too large for memory fails on the first one.
    """
    if max_tokens_per_microbatch <= 0:
        raise ValueError("max_tokens_per_microbatch must be positive")
    lengths = [len(row) for row in rows]
    for i, n in enumerate(lengths):
        if n == 0 or n > max_tokens_per_microbatch:
            raise ValueError(
                f"row {i} ({rows[i].rollout_id}) has {n} tokens; the budget is {max_tokens_per_microbatch} "
                "(drop longer rows with rollout_rows(max_length=...))"
            )
    order = sorted(range(len(rows)), key=lambda i: (-lengths[i], i))
    if layout == "padded":
        microbatches = [
            _fill(rows, [[i] for i in group], pad_token_id, layout)
            for group in _bins_padded(order, lengths, max_tokens_per_microbatch)
        ]
    elif layout == "packed":
        microbatches = [
            _fill(rows, [group], pad_token_id, layout)
            for group in _bins_packed(order, lengths, max_tokens_per_microbatch)
        ]
    else:
        raise ValueError(f"layout must be 'padded' or 'packed', not {layout!r}")
    return Packing(microbatches, loss_normalizer(rows))
