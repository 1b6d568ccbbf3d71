"""Step metrics computed from rollout outcomes, under the names TRL users know (REFERENCE §3.5).

``rewards/<func>/mean|std`` (func: the reward function's name, ``env_reward``
when the verifier reward is used), ``reward``/``reward_std`` come from
``harness_grpo.advantages.group_metrics``. Tool metrics follow the
loop-owning definitions: ``tools/call_frequency`` = mean tool calls per
scored-or-not rollout, ``tools/failure_frequency`` = total failures / total
calls, ``tools/<name>/call_total``, ``tools/loop_exhausted_frac`` = fraction
of rollouts that timed out. ``rollout/correctness_mean`` is the mean verifier
reward over rollouts it could score (``rollout/unscorable_frac``, the
fraction of rollouts without a reward, is ``group_metrics``').
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from harness_grpo.session_protocol import HarnessRolloutOutcome


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _std(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def outcome_metrics(
    outcomes: Sequence[HarnessRolloutOutcome], rewards: Sequence[float | None], reward_name: str
) -> dict[str, float]:
    """Metrics of one step's rollouts; ``rewards`` are what the advantages used (None: unscorable)."""
    scored = [r for r in rewards if r is not None]
    env = [o.env_reward for o in outcomes if o.env_reward is not None and o.error is None]
    calls = sum(o.tool_call_count for o in outcomes)
    failures = sum(o.tool_failure_count for o in outcomes)
    by_name: Counter[str] = Counter()
    for o in outcomes:
        by_name.update(o.tool_calls_by_name)
    metrics = {
        f"rewards/{reward_name}/mean": _mean(scored),
        f"rewards/{reward_name}/std": _std(scored),
        "rollout/correctness_mean": _mean(env),
        "rollout/errors": float(sum(o.error is not None for o in outcomes)),
        "rollout/turns_mean": _mean([len(o.trace.turns) for o in outcomes if o.trace is not None]),
        "tools/call_frequency": calls / len(outcomes) if outcomes else 0.0,
        "tools/failure_frequency": failures / calls if calls else 0.0,
        "tools/loop_exhausted_frac": sum(o.timed_out for o in outcomes) / len(outcomes) if outcomes else 0.0,
    }
    for name, count in sorted(by_name.items()):
        metrics[f"tools/{name or 'unnamed'}/call_total"] = float(count)
    return metrics
