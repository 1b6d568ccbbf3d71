"""Step metrics computed from rollout outcomes, under the names and meanings TRL users know (REFERENCE §3.5).

Per step, over the groups it consumed:

- ``rewards/<name>/mean|std``: per reward column (``harness_grpo.reward_funcs``), over the rollouts
  the column scored (None excluded); without columns, the reward the advantages used
  (``harness_reward``, TRL's harness column); ``reward``, ``reward_std``, ``frac_reward_zero_std`` and
  the unscorable counts come from ``harness_grpo.advantages.group_metrics``.
- ``tools/call_frequency``: mean tool calls per rollout, and ``tools/failure_frequency``: mean of
  the per-rollout failure ratios (failures / calls, over rollouts that called a tool), both over
  only the groups in which at least one rollout called a tool (absent when none did).
- ``tools/<name>_call_total``: calls per tool name.
- ``tools/latency_s`` and ``tools/<name>_latency_s``: seconds per tool call, white-box mode only
  (loop-owning traces carry no timestamps; see ``harness_grpo.white_box.ToolReport``).
- ``rollout/correctness_mean``: mean verifier ``env_reward`` over the rollouts that have one,
  logged only when a ``rollout_reward_fn`` shapes the reward (otherwise it is the reward itself).
- ``rollout/timed_out_frac``: fraction of rollouts stopped at the rollout timeout;
  ``rollout/errors``: rollouts that failed to run; ``rollout/turns_mean``: selected turns per rollout.

Built-in tool loop only (``environment_factory`` / ``tools=``, rollouts with an ``episode``):
``tools/unknown_name_count`` (calls of names outside the rollout's tools, summed over the step),
``tools/parallel_calls_mean`` (tool calls per assistant turn that made any), and
``tools/loop_exhausted_frac`` (rollouts that ran that ended on a limit: ``max_tool_calling_iterations``,
``max_completion_length``, ``max_model_calls`` or the rollout timeout, rather than the model stopping).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from harness_grpo.outcomes import HarnessRolloutOutcome

REWARD_NAME = "harness_reward"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _std(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def reward_metrics(columns: Mapping[str, Sequence[float | None]]) -> dict[str, float]:
    """``rewards/<name>/mean`` and ``/std`` of each reward column, over the values that are not None."""
    metrics = {}
    for name, values in columns.items():
        scored = [v for v in values if v is not None]
        metrics[f"rewards/{name}/mean"] = _mean(scored)
        metrics[f"rewards/{name}/std"] = _std(scored)
    return metrics


def outcome_metrics(
    groups: Sequence[Sequence[HarnessRolloutOutcome]],
    rewards: Sequence[float | None],
    *,
    shaped: bool,
    reward_columns: Mapping[str, Sequence[float | None]] | None = None,
) -> dict[str, float]:
    """Metrics of one step's rollouts (module docstring); ``rewards`` are what the advantages used
    (None: unscorable), in the order of the flattened ``groups``; ``shaped``: the reward is not the
    verifier's alone; ``reward_columns``: each reward column's values, in the same order."""
    outcomes = [o for group in groups for o in group]
    metrics = reward_metrics(reward_columns if reward_columns is not None else {REWARD_NAME: rewards})
    metrics |= {
        "rollout/errors": float(sum(o.error is not None for o in outcomes)),
        "rollout/timed_out_frac": sum(o.timed_out for o in outcomes) / len(outcomes) if outcomes else 0.0,
        "rollout/turns_mean": _mean([len(o.trace) for o in outcomes if o.error is None]),
    }
    if shaped:
        metrics["rollout/correctness_mean"] = _mean(
            [o.env_reward for o in outcomes if o.env_reward is not None and o.error is None]
        )
    calling = [o for group in groups if any(o.tool_call_count for o in group) for o in group]
    if calling:
        metrics["tools/call_frequency"] = _mean([float(o.tool_call_count) for o in calling])
        metrics["tools/failure_frequency"] = _mean(
            [o.tool_failure_count / o.tool_call_count for o in calling if o.tool_call_count]
        )
    by_name: Counter[str] = Counter()
    latency: defaultdict[str, list[float]] = defaultdict(list)
    for o in outcomes:
        by_name.update(o.tool_calls_by_name)
        for name, seconds in o.tool_latency_s:
            latency[name].append(seconds)
    for name, count in sorted(by_name.items()):
        metrics[f"tools/{name or 'unnamed'}_call_total"] = float(count)
    if latency:
        metrics["tools/latency_s"] = _mean([s for values in latency.values() for s in values])
        for name, values in sorted(latency.items()):
            metrics[f"tools/{name or 'unnamed'}_latency_s"] = _mean(values)
    episodes = [o for o in outcomes if o.episode is not None]
    if episodes:
        parallel = [float(n) for o in episodes for n in o.episode.parallel_calls]
        metrics["tools/unknown_name_count"] = float(sum(o.episode.unknown_names for o in episodes))
        metrics["tools/parallel_calls_mean"] = _mean(parallel)
        metrics["tools/loop_exhausted_frac"] = _mean([float(o.episode.loop_exhausted or o.timed_out) for o in episodes])
    return metrics
