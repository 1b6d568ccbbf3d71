"""Both ways with TRL, through our rollout service: TRL's harness worker drives ``HarborSessionFactory`` unchanged.

The embedded engine serving the warm tiny model (``python -m harness_grpo.engine``) and our rollout service in front
of it (``python -m harness_grpo.serve``, started as ``tests/service`` starts it, with its own capture proxy and the
local sandbox), each in its own process on loopback. TRL 1.16's ``HarnessRolloutWorker`` runs two groups of two
terminus-2 rollouts (two model calls each) through ``RecordingHarborSessionFactory`` (``HarborSessionFactory`` that
also writes down what each session handed TRL) to the rows it queues, and those rows are checked to be exactly the
rows our trainer builds from the same traces and rewards (``tests/trl_interop/trl_worker.py``). The tasks' verifier
writes a reward unique to each trial (the clock's nanoseconds), so every group's advantages are non-zero.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from trl.chat_template_utils import qwen3_template

from harness_grpo.harbor_service_sessions import HarborSessionFactory
from tests.agents.conftest import _embedded_model
from tests.sandbox.conftest import make_task
from tests.service.conftest import Service, start_service
from tests.support.processes import EngineProcess, start_engine
from tests.trl_interop.recording import RecordingHarborSessionFactory
from tests.trl_interop.trl_worker import check_rows_are_ours, queued_rows

GENERATIONS = 2
CALLS = 2
VERIFIER = """\
#!/bin/bash
mkdir -p /logs/verifier
echo "0.$(date +%N)" > /logs/verifier/reward.txt
"""


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    with start_engine("--model", _embedded_model(), timeout_s=300) as process:
        yield process


@pytest.fixture(scope="module")
def service(engine: EngineProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Path]]:
    """Our rollout service serving two tasks that differ in their instruction only, and those tasks."""
    dataset = tmp_path_factory.mktemp("dataset") / "tasks"
    dataset.mkdir()
    for name in ("count-a", "count-b"):
        task = make_task(dataset, name, test=VERIFIER, agent_timeout_s=60.0)
        (task / "instruction.md").write_text(f"Count the files in /app ({name}).\n")
    running = start_service("ours", dataset, engine.url, tmp_path_factory.mktemp("service"), max_concurrent=GENERATIONS)
    try:
        yield running, dataset
    finally:
        running.process.stop()


@pytest.mark.timeout(600)
def test_trl_worker_on_our_service_builds_the_rows_our_trainer_builds(
    engine: EngineProcess, service: tuple[Service, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, dataset = service
    rows = HarborSessionFactory(running.url, split=str(dataset)).prompt_rows()
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    factory = functools.partial(
        RecordingHarborSessionFactory,
        running.url,
        record_dir=str(record_dir),
        split=str(dataset),
        harness="terminus-2",
        sandbox="local",
        llm_url=engine.url,
        agent_step_limit=CALLS,
        agent_timeout_sec=60.0,
    )
    tokenizer = AutoTokenizer.from_pretrained(_embedded_model())
    tokenizer.response_template = qwen3_template  # the tiny model speaks Qwen3's tool-call format
    prompts = [row["prompt"] for row in rows]
    samples = queued_rows(factory, tokenizer, prompts, generations=GENERATIONS, monkeypatch=monkeypatch)
    records = check_rows_are_ours(samples, record_dir, GENERATIONS)
    for group_id in samples:
        group = records[group_id]
        rewards = [record["reward"] for record in group]
        assert len(set(rewards)) == GENERATIONS and all(0.0 <= r < 1.0 for r in rewards), rewards
        for record in group:
            turns = record["trace"]["turns"]
            assert len(turns) == CALLS, record  # terminus-2's turns end with the call budget
            assert all(turn["metadata"]["sampling_params"]["temperature"] == 1.0 for turn in turns)  # TRL's policy
    print(f"TRL queued {sum(map(len, samples.values()))} rows of {len(samples)} groups from our rollout service")
