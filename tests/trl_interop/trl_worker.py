"""TRL 1.16's ``HarnessRolloutWorker`` run to the rows it queues, and those rows checked against the ones we build.

``queued_rows(factory, tokenizer, prompts, generations=, monkeypatch=)`` starts TRL's worker (its spawned child
process, its ``TrainableSession`` check, ``_turns_from_training_trace`` and its row builder) in loop-owning mode on
``factory`` (a callable taking ``sampling=``, as TRL builds it), one group per prompt, and returns the rows it queued
by group id once every prompt's group is queued (``TimeoutError`` after ``timeout_s``); a group first queued after
the worker's stop is left out, since the stop closes sessions still in flight. No GPU: that worker never
calls vLLM itself (the agents' calls go through a capture proxy), so it is let start without vLLM installed.

``check_rows_are_ours(samples, record_dir, generations)`` reads what each recording session handed TRL
(``tests/trl_interop/recording.py``), builds the rows our trainer builds from it (``sequences_from_trace`` →
``rollout_rows`` with ``group_advantages``, as ``HarnessAsyncGRPOTrainer._rows_and_metrics``) and asserts TRL's rows of
each group are exactly ours: token ids, loss masks, behaviour logprobs (TRL stores them as float32) and advantages;
it returns the records by group id.
"""

from __future__ import annotations

import json
import queue
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from accelerate.state import PartialState
from datasets import Dataset
from trl.experimental.async_grpo import async_rollout_worker
from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker

from harness_grpo.advantages import group_advantages
from harness_grpo.rows import rollout_rows
from proxy.capture_graph import sequences_from_trace
from proxy.trace import TrainingTrace

Row = tuple[list[int], list[int], list[float], float]


def queued_rows(
    factory: Any,
    tokenizer: Any,
    prompts: list[list[dict[str, Any]]],
    *,
    generations: int,
    monkeypatch: pytest.MonkeyPatch,
    timeout_s: float = 300.0,
) -> dict[int, list[Any]]:
    """The rows TRL's worker queued for each prompt's group (module docstring)."""
    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda: True)
    worker = HarnessRolloutWorker(
        harness_session_factory=factory,
        model_name="policy",
        dataset=Dataset.from_list([{"prompt": prompt} for prompt in prompts]),
        reward_funcs=[],
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        num_generations=generations,
        max_inflight_tasks=generations,
        temperature=1.0,
        vllm_server_url="http://127.0.0.1:9",  # never called
        child_ready_timeout=240,
    )
    samples: dict[int, list[Any]] = defaultdict(list)
    PartialState()  # as TRL's trainer has it: the worker logs through accelerate
    try:
        worker.start()
        deadline = time.monotonic() + timeout_s
        while len(samples) < len(prompts):
            worker.check_health(stale_after_s=timeout_s)
            if time.monotonic() > deadline:
                raise TimeoutError(f"TRL queued rows of {len(samples)} of {len(prompts)} groups in {timeout_s} s")
            try:
                sample = worker.rollout_buffer.get(timeout=1.0)
            except queue.Empty:
                continue
            samples[sample.group_id].append(sample)
    finally:
        worker.stop()
    seen = set(samples)
    while True:  # rows of a group are queued together: take the rest of the groups already seen
        try:
            sample = worker.rollout_buffer.get(timeout=1.0)
        except queue.Empty:
            return samples
        if sample.group_id in seen:  # a group first queued after the stop may hold sessions the stop closed
            samples[sample.group_id].append(sample)


def our_rows(records: list[dict[str, Any]]) -> list[Row]:
    """The rows our trainer builds for one group's rollouts (``HarnessAsyncGRPOTrainer._rows_and_metrics``)."""
    advantages, _ = group_advantages([record["reward"] for record in records])
    rows = []
    for index, (record, advantage) in enumerate(zip(records, advantages, strict=True)):
        trace = TrainingTrace.from_json(json.dumps(record["trace"]))
        for row in rollout_rows(
            sequences_from_trace(trace), advantage, policy_version=0, rollout_id=str(index), group_id="g"
        ):
            rows.append((row.input_ids, row.loss_mask, row.behaviour_logprobs, row.advantage))
    return rows


def row_key(ids: Any, mask: Any, logprobs: Any) -> tuple[tuple[int, ...], tuple[int, ...], bytes]:
    """A row as TRL keeps it: int64 ids and mask, float32 logprobs."""
    return (
        tuple(np.asarray(ids, dtype=np.int64).tolist()),
        tuple(np.asarray(mask, dtype=np.int64).tolist()),
        np.asarray(logprobs, dtype=np.float32).tobytes(),
    )


def check_rows_are_ours(
    samples: dict[int, list[Any]], record_dir: Path, generations: int
) -> dict[int, list[dict[str, Any]]]:
    """Assert TRL's rows of each queued group are the rows we build (module docstring); the records by group id."""
    records: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for path in record_dir.glob("*.json"):
        record = json.loads(path.read_text())
        records[record["seed"]].append(record)
    for group_id, group_samples in samples.items():
        group_records = records[group_id]
        assert len(group_records) == generations  # every rollout of a queued group handed TRL its trace
        ours = our_rows(group_records)
        assert sorted(row_key(ids, mask, logprobs) for ids, mask, logprobs, _ in ours) == sorted(
            row_key(s.input_ids, s.completion_mask, s.old_log_probs) for s in group_samples
        )
        by_row = {row_key(ids, mask, logprobs): advantage for ids, mask, logprobs, advantage in ours}
        for s in group_samples:
            assert s.advantage == pytest.approx(by_row[row_key(s.input_ids, s.completion_mask, s.old_log_probs)])
            trained = s.completion_mask.astype(bool)
            assert trained.any() and np.all(s.old_log_probs[trained] <= 0.0)
    return records
