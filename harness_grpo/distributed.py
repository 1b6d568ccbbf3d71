"""How one optimizer step's work is shared by the training ranks (one process: all no-ops).

Rank 0 owns the services (engine, proxy, rollout producer) and builds the step's rows; it
broadcasts them, and every rank trains on its share (``shard_rows``: balanced by tokens,
deterministic, so every rank computes every share alike). Data-parallel wrappers (DDP, FSDP2)
synchronise gradients in each backward, so every rank must run the same number of backwards:
the trainer pads each rank's micro-batches with zero-loss ones (``filler_row``) up to the ranks'
maximum (``max_over_ranks``).
They also average gradients over ranks, so a rank scales its share of the global-normalised
loss by the world size (``loss_scale``) to make the summed step loss the one-process loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from harness_grpo.rows import Row


def rank_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def broadcast_from_main[T](value: T | None) -> T:
    """Rank 0's ``value`` on every rank (pickled; rank 0 passes the value, the others None)."""
    rank, world = rank_world()
    if world == 1:
        assert value is not None
        return value
    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def gather_to_all[T](value: T) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank."""
    _, world = rank_world()
    if world == 1:
        return [value]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, value)
    return out


def max_over_ranks(value: int) -> int:
    """The largest ``value`` any rank passed."""
    return max(gather_to_all(value))


def loss_scale() -> float:
    """Factor on a rank's loss so that gradient averaging over ranks yields the summed loss's gradient."""
    return float(rank_world()[1])


def shard_rows(rows: Sequence[Row], rank: int, world: int) -> list[Row]:
    """``rank``'s share of ``rows``: longest first, each to the rank with the fewest tokens so far.

    Deterministic in ``rows`` (ties go to the lower rank), so each rank can compute its own share.
    """
    if world == 1:
        return list(rows)
    load = [0] * world
    shares: list[list[Row]] = [[] for _ in range(world)]
    for index in sorted(range(len(rows)), key=lambda i: (-len(rows[i]), i)):
        target = min(range(world), key=lambda r: (load[r], r))
        shares[target].append(rows[index])
        load[target] += len(rows[index])
    return shares[rank]


def filler_row(pad_token_id: int) -> Row:
    """A two-token row with advantage and weight 0: a backward that moves no weight but runs every collective."""
    return Row(
        input_ids=[pad_token_id, pad_token_id],
        loss_mask=[0, 1],
        behaviour_logprobs=[0.0, 0.0],
        advantage=0.0,
        weight=0.0,
        policy_version=0,
        rollout_id="filler",
        group_id="filler",
    )
