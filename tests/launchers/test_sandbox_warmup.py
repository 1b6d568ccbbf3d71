"""The template warm-up (``harness_grpo.sandbox_warmup``) prepares each distinct environment once, one at a time:
real Harbor trials with the ``nop`` agent in the local sandbox, instrumented to record when each environment
started and stopped."""

from __future__ import annotations

from pathlib import Path

from harness_grpo.sandbox_warmup import distinct_environments, environment_digest, warm_templates

TASKS = sorted(path.parent for path in (Path(__file__).resolve().parents[2] / "examples" / "tasks").glob("*/task.toml"))


def test_each_distinct_environment_is_prepared_once_and_never_two_at_once(tmp_path: Path) -> None:
    record = tmp_path / "environments.log"
    distinct = distinct_environments(TASKS)
    assert 1 < len(distinct) < len(TASKS)  # some example tasks share an environment definition
    lines: list[str] = []
    results = warm_templates(
        TASKS,
        "tests.launchers.warmup_environment:RecordingEnvironment",
        environment_kwargs={"record": str(record)},
        timeout_s=120,
        report=lines.append,
    )
    assert [result.error for result in results] == [None] * len(distinct)
    assert [result.task for result in results] == [task.name for task in distinct.values()]
    assert len(lines) == len(distinct) and all("ready in" in line for line in lines)
    events = [line.split() for line in record.read_text().splitlines()]
    assert [event for event, _, _ in events] == ["start", "stop"] * len(distinct)  # strictly one after the other
    assert [task for event, task, _ in events if event == "start"] == [task.name for task in distinct.values()]
    times = [float(moment) for _, _, moment in events]
    assert times == sorted(times)


def test_the_digest_follows_the_environment_definition(tmp_path: Path) -> None:
    task = tmp_path / "task"
    (task / "environment").mkdir(parents=True)
    (task / "task.toml").write_text("[environment]\ncpus = 1\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    first = environment_digest(task)
    (task / "instruction.md").write_text("anything")  # not part of the template
    assert environment_digest(task) == first
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:22.04\n")
    second = environment_digest(task)
    (task / "task.toml").write_text("[environment]\ncpus = 2\n")  # resources are baked into a template too
    assert len({first, second, environment_digest(task)}) == 3
