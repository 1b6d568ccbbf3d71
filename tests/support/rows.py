"""Synthetic training rows for tests that drive packing, the loss or an optimizer step without rollouts.

``scored_rows(spec)``: one row per ``(length, advantage)``, a context prefix (a third of the row
unless ``context`` is given) then trained tokens whose behaviour logprobs sit near the tiny model's
uniform ``-log(8192) ≈ -9``, each row its own rollout weighted to count once. ``random_rows(k)``:
rows of random lengths with random trainable positions (about 30%), pairs of rows per rollout.
"""

from __future__ import annotations

import random

from harness_grpo.rows import Row


def scored_rows(
    spec: list[tuple[int, float]], *, seed: int = 0, vocab: int = 8192, context: int | None = None
) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for i, (n, advantage) in enumerate(spec):
        n_context = n // 3 if context is None else context
        mask = [0] * n_context + [1] * (n - n_context)
        rows.append(
            Row(
                input_ids=[rng.randrange(3, vocab) for _ in range(n)],
                loss_mask=mask,
                behaviour_logprobs=[rng.uniform(-9.2, -8.8) if m else 0.0 for m in mask],
                advantage=advantage,
                weight=1.0 / sum(mask),
                policy_version=0,
                rollout_id=f"r{i}",
                group_id="g",
            )
        )
    return rows


def random_row(n: int, *, seed: int, rollout: str = "r", advantage: float = 1.0, weight: float = 1.0) -> Row:
    rng = random.Random(seed)
    mask = [0] + [int(rng.random() < 0.3) for _ in range(n - 1)]
    mask[-1] = 1
    logps = [-rng.random() if m else 0.0 for m in mask]
    ids = [rng.randrange(1, 8000) for _ in range(n)]
    return Row(ids, mask, logps, advantage, weight, policy_version=0, rollout_id=rollout, group_id="g")


def random_rows(k: int = 40, seed: int = 0) -> list[Row]:
    rng = random.Random(seed)
    return [
        random_row(rng.randint(2, 300), seed=i, rollout=f"r{i // 2}", advantage=rng.uniform(-1, 1)) for i in range(k)
    ]
