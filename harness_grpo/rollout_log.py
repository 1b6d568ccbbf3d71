"""The rollout log: every rollout a training step consumed, one JSON line each (``save_rollouts``).

``output_dir/rollouts.jsonl`` gets, per rollout, in the order the step took them: ``step`` (the optimizer step
that trained on it, 1-based), ``group_id``, ``rollout`` (its index in the group), ``task`` (the row's
``task_name`` when it has one), ``policy_version`` (the engine's weights when its group started), ``reward``
(after ``rollout_reward_fn``; null: unscorable, no rows), ``env_reward``, ``timed_out``, ``error`` and ``trace``
(its ``TrainingTrace`` as OpenEnv's schema-v1 JSON; null when the rollout failed before one was fetched). A
resumed run appends, so the file holds each trained step once as long as the run resumes from its last
checkpoint. Rank 0 writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from harness_grpo.rollouts import RolloutGroup

ROLLOUT_LOG = "rollouts.jsonl"


def append_rollouts(
    path: Path, step: int, groups: Sequence[RolloutGroup], rewards: Sequence[Sequence[float | None]]
) -> None:
    """Append one line per rollout of ``groups`` (``rewards[i][j]``: the shaped reward of rollout j of group i)."""
    lines = []
    for group, group_rewards in zip(groups, rewards, strict=True):
        for index, (outcome, reward) in enumerate(zip(group.outcomes, group_rewards, strict=True)):
            trace = outcome.training_trace
            lines.append(
                b'{"step":%d,"group_id":%s,"rollout":%d,"task":%s,"policy_version":%d,"reward":%s,'
                b'"env_reward":%s,"timed_out":%s,"error":%s,"trace":%s}\n'
                % (
                    step,
                    orjson.dumps(group.group_id),
                    index,
                    orjson.dumps(group.row.get("task_name")),
                    group.policy_version,
                    orjson.dumps(reward),
                    orjson.dumps(outcome.env_reward),
                    orjson.dumps(outcome.timed_out),
                    orjson.dumps(outcome.error),
                    b"null" if trace is None else trace.to_json(),
                )
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as sink:
        sink.writelines(lines)
