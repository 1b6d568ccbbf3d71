"""Training rows: one rollout's captured sequences, stamped with its advantage and a loss weight.

    row        one training sequence (a root-to-leaf path of the capture graph): the exact ids, the
               exact loss mask (zeros inside a completion stay zeros: context tokens are never
               trained) and the engine's behaviour logprob per position (0.0 where the mask is 0).
               Position 0 is never trainable (no logit predicts it).
    advantage  one per rollout, stamped on every row it produced (REFERENCE §3.3).
    turn advantages
               with per-turn rewards (harness_grpo.reward_funcs), each model call's completion adds
               its own turn-level term on top: `turn_advantages` spans (start, end, extra) over the
               row's positions, so a token's advantage is `advantage + extra` inside a span.
    weight     the row's per-token loss weight. The loss (harness_grpo.loss) is

                   L = sum_rows weight * sum_t mask_t * loss_t / normalizer,
                   normalizer = loss_normalizer(all rows of the optimizer step)
                              = sum_rows weight * n_trainable

Weighting (the `weighting` argument, the config's `loss_weighting`):
  * "token" (default, as TRL's async GRPO): weight = 1, normalizer = trainable tokens in the step: a
    global token mean (TRL, DAPO). Long rollouts dominate the gradient. Forks do not inflate it
    here, because the capture graph supervises a shared node once, so a forked rollout's tokens are
    not counted twice.
  * "rollout": weight = 1 / T_rollout, T_rollout = trainable tokens over the rollout's
    kept rows. Each rollout contributes the token mean of its own tokens and the normalizer is the
    number of rollouts: L = mean over rollouts of per-rollout token means. A rollout counts once
    however the capture split it (forks, compaction roots, K rows) and however long it is (Agent
    Lightning's `per_rollout_mean`). A per-ROW mean (original GRPO) would count a K-row rollout K
    times — that is the failure mode of REFERENCE §6.13.
  The per-rollout mean has the length bias Dr. GRPO describes (a long failing rollout's tokens are
  each pushed down less); the token mean has none but lets one 40-turn rollout outweigh a dozen
  short ones. The default leaves GRPO's weighting as the async GRPO trainer has it; agent rollouts
  vary in length by orders of magnitude, which is when "rollout" is worth trying.

Dropped rows, counted in `RowStats` (never silently cut): rows whose role is not in `include_roles`
(auxiliary and discarded paths by default), rows with no trainable token, and rows longer than
`max_length` (dropping, not truncating: cutting from the left would orphan the context of the
trained tokens, from the right would silently lose trained tokens). Weights are computed over the
rows kept. Rows of an unscorable rollout are never made: the caller skips it (advantage 0).
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from proxy.capture_graph import AGENT, TrainingSequence

__all__ = ["Row", "RowStats", "Span", "Weighting", "call_spans", "loss_normalizer", "rollout_rows"]

Weighting = Literal["rollout", "token"]
Span = tuple[int, int, float]
"""(start, end, extra advantage) over a sequence's positions: one model call's completion."""


@dataclass(slots=True)
class Row:
    """One training row; `__post_init__` validates lengths, mask values and the weight.

    `behaviour_logprobs` is 0.0 where the mask is 0 by the capture contract; the loss never reads
    those positions. `policy_version` is the engine weights version stamped at group start; the
    staleness filter (drop when current - version > max_staleness) runs at dequeue, before rows.
    """

    input_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    advantage: float
    weight: float
    policy_version: int
    rollout_id: str
    group_id: str
    role: str = AGENT
    node_ids: tuple[str, ...] = ()
    turn_advantages: tuple[Span, ...] = ()
    n_trainable: int = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.behaviour_logprobs) != n:
            raise ValueError(
                f"row {self.rollout_id}: {n} ids, {len(self.loss_mask)} mask values, "
                f"{len(self.behaviour_logprobs)} logprobs; all three must be equal"
            )
        if not set(self.loss_mask) <= {0, 1}:
            raise ValueError(f"row {self.rollout_id}: loss_mask values must be 0 or 1")
        if n and self.loss_mask[0]:
            raise ValueError(f"row {self.rollout_id}: position 0 is trainable but no logit predicts it")
        if not (math.isfinite(self.advantage) and math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"row {self.rollout_id}: advantage {self.advantage}, weight {self.weight}")
        for start, end, extra in self.turn_advantages:
            if not (0 < start <= end <= n and math.isfinite(extra)):
                raise ValueError(f"row {self.rollout_id}: turn advantage span {(start, end, extra)} of a {n}-token row")
        self.n_trainable = sum(self.loss_mask)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def has_signal(self) -> bool:
        """Some trained token has a nonzero advantage (else, without a KL term, the row moves no weight)."""
        return self.advantage != 0.0 or any(extra != 0.0 for _, _, extra in self.turn_advantages)


@dataclass(slots=True)
class RowStats:
    """Counters accumulated over `rollout_rows` calls (pass one instance per step to each call)."""

    rollouts: int = 0
    rollouts_without_rows: int = 0
    rows: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    excluded_role: int = 0
    dropped_empty: int = 0
    dropped_too_long: int = 0

    def metrics(self) -> dict[str, float]:
        return {
            "rows/per_rollout": self.rows / self.rollouts if self.rollouts else 0.0,
            "rows/trainable_frac": self.trainable_tokens / self.tokens if self.tokens else 0.0,
            "rows/excluded_role": float(self.excluded_role),
            "rows/dropped_empty": float(self.dropped_empty),
            "rows/dropped_too_long": float(self.dropped_too_long),
            "rows/rollouts_without_rows": float(self.rollouts_without_rows),
        }


def rollout_rows(
    sequences: Sequence[TrainingSequence],
    advantage: float,
    *,
    policy_version: int,
    rollout_id: str,
    group_id: str,
    include_roles: Container[str] = (AGENT,),
    max_length: int | None = None,
    weighting: Weighting = "token",
    stats: RowStats | None = None,
    turn_advantages: Mapping[str, Span] | None = None,
) -> list[Row]:
    """Rows for one scored rollout, one per kept sequence, in the sequences' order.

    Every row gets `advantage`, and the span of each of its nodes in `turn_advantages` (by node id, see
    `call_spans`); weights follow `weighting` (module docstring). Which tokens train
    is the sequences' masks' business (see `harness_grpo.turn_masks`). Rows without a trainable
    token, of an excluded role, or longer than `max_length` are dropped and counted in `stats`.
    Raises ValueError on malformed sequences.
    """
    stats = stats if stats is not None else RowStats()
    stats.rollouts += 1
    kept: list[tuple[TrainingSequence, list[int], list[float]]] = []
    for seq in sequences:
        if seq.role not in include_roles:
            stats.excluded_role += 1
            continue
        mask, logps = list(seq.loss_mask), list(seq.logprobs)
        if max_length is not None and len(seq.token_ids) > max_length:
            stats.dropped_too_long += 1
            continue
        if not any(mask):
            stats.dropped_empty += 1
            continue
        kept.append((seq, mask, logps))
    rows = [
        Row(
            input_ids=list(seq.token_ids),
            loss_mask=mask,
            behaviour_logprobs=logps,
            advantage=float(advantage),
            weight=1.0,
            policy_version=policy_version,
            rollout_id=rollout_id,
            group_id=group_id,
            role=seq.role,
            node_ids=tuple(seq.node_ids),
            turn_advantages=tuple(turn_advantages[n] for n in seq.node_ids if n in turn_advantages)
            if turn_advantages
            else (),
        )
        for seq, mask, logps in kept
    ]
    total = sum(row.n_trainable for row in rows)
    if weighting == "rollout":
        for row in rows:
            row.weight = 1.0 / total
    elif weighting != "token":
        raise ValueError(f"weighting must be 'rollout' or 'token', not {weighting!r}")
    stats.rows += len(rows)
    stats.rollouts_without_rows += not rows
    stats.tokens += sum(len(row) for row in rows)
    stats.trainable_tokens += total
    return rows


def call_spans(calls: Sequence[Mapping], extras: Sequence[float]) -> dict[str, Span]:
    """Each model call's completion span with its extra advantage, by node id; calls with extra 0 are left out.

    ``calls`` are capture entries (``HarnessRolloutOutcome.trace``: ``prompt_token_ids``,
    ``completion_token_ids``, ``metadata.node_id``), one per value of ``extras``. A call's prompt is a prefix
    of every sequence through its node, so the span holds in each of them.
    """
    if len(calls) != len(extras):
        raise ValueError(f"{len(extras)} turn advantages for {len(calls)} model calls")
    spans: dict[str, Span] = {}
    for call, extra in zip(calls, extras, strict=True):
        if extra != 0.0:
            start = len(call["prompt_token_ids"])
            spans[call["metadata"]["node_id"]] = (start, start + len(call["completion_token_ids"]), float(extra))
    return spans


def loss_normalizer(rows: Sequence[Row]) -> float:
    """The step's loss denominator: sum of weight * trainable tokens over ALL rows of the step.

    With "rollout" weighting it is the number of rollouts, with "token" the number of trainable
    tokens. Pass the same value to every micro-batch of the step, so summed micro-batch losses are
    the step loss whatever the packing.
    """
    return math.fsum(row.weight * row.n_trainable for row in rows)
