"""White-box mode: the trainer's own tool loop (``harness_adapter``) through the real proxy and engine.

The submit task runs as ``examples/white_box_submit.py``: the adapter executes the task's tools
in-process and calls the model only through ``model_step`` (the capture proxy under the rollout's
session key). Checked: every rollout is captured and scored by the task's verifier, the tool calls
the model made are counted from the trace, the turns' requests carry the tool results back (the
loop really is multi-turn), and a failing adapter makes its rollouts unscorable instead of killing
the run.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from examples import submit_task
from examples.white_box_submit import SubmitTaskSessionFactory, SubmitToolLoop
from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.rollouts import run_rollout
from harness_grpo.session_protocol import SessionContractError
from harness_grpo.trainer import HarnessAsyncGRPOTrainer
from harness_grpo.white_box import HarnessRunLimits, ModelStep


def _args(tmp_path: Path, steps: int) -> HarnessGRPOConfig:
    return HarnessGRPOConfig(
        output_dir=str(tmp_path),
        seed=0,
        max_steps=steps,
        learning_rate=3e-4,
        num_generations=4,
        groups_per_step=1,
        temperature=1.0,
        max_completion_length=64,
        max_tool_calling_iterations=3,
        rollout_timeout_s=120,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text or "{}"), dict)
    except ValueError:
        return False


class RecordingLoop(SubmitToolLoop):
    """``SubmitToolLoop`` that keeps what its episodes saw, for the test to inspect."""

    def __init__(self) -> None:
        self.episodes: list[dict[str, Any]] = []

    def run_white_box(self, model_step: ModelStep, session: Any, limits: HarnessRunLimits) -> None:
        replies: list[dict[str, Any]] = []

        def recording_step(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
            reply = model_step(messages, tools)
            replies.append(reply)
            return reply

        super().run_white_box(recording_step, session, limits)
        self.episodes.append({"replies": replies, "limits": limits})


class BrokenLoop:
    def run_white_box(self, model_step: ModelStep, session: Any, limits: HarnessRunLimits) -> None:
        model_step([{"role": "user", "content": "hi"}], None)
        raise RuntimeError("the environment crashed")


@pytest.mark.timeout(600)
def test_white_box_rollouts_are_captured_scored_and_trained(tmp_path: Path) -> None:
    loop = RecordingLoop()
    trainer = HarnessAsyncGRPOTrainer(
        str(submit_task.task_model_path()),
        SubmitTaskSessionFactory,
        _args(tmp_path, steps=2),
        submit_task.dataset(),
        harness_adapter=loop,
    )
    trainer.train()
    assert len(trainer.state.log_history) == 2
    assert len(loop.episodes) >= 8  # two groups of four (the producer may have started more)
    for episode in loop.episodes:
        assert episode["limits"].max_turns == 3 and episode["limits"].sampling == trainer.args.sampling_policy()
        assert 1 <= len(episode["replies"]) <= 3
    for entry in trainer.state.log_history:
        assert entry["rollout/errors"] == 0 and entry["rollout/unscorable_frac"] == 0
        assert entry["rollout/turns_mean"] >= 1
        assert 0.0 <= entry["rewards/harness_reward/mean"] <= 1.0
        assert "rollout/correctness_mean" not in entry  # no rollout_reward_fn: the reward is the verifier's
    assert any(reply.get("tool_calls") for e in loop.episodes for reply in e["replies"])  # the task SFT's doing
    assert sum(entry.get("tools/call_frequency", 0) for entry in trainer.state.log_history) > 0
    assert any("tools/latency_s" in entry for entry in trainer.state.log_history)  # white-box: timed per call


@pytest.mark.timeout(600)
def test_a_white_box_rollout_records_the_tool_results_it_sends_back(tmp_path: Path) -> None:
    """One rollout by hand through the trainer's services: the trace holds the loop's turns, tool results included."""
    trainer = HarnessAsyncGRPOTrainer(
        str(submit_task.task_model_path()),
        SubmitTaskSessionFactory,
        _args(tmp_path, steps=1),
        submit_task.dataset(),
        harness_adapter=SubmitToolLoop(),
    )
    trainer._start_services()
    try:
        multi_turn = []
        for seed in range(8):
            task = {"prompt": "Read notes.txt, then submit."}
            outcome = run_rollout(trainer.session_factory, task, seed=seed, timeout_s=120)
            assert outcome.error is None and outcome.training_trace is not None
            turns = outcome.training_trace.turns
            called = [
                (call["function"]["name"], call["function"]["arguments"])
                for t in turns
                for call in t.response["choices"][0]["message"].get("tool_calls") or []
            ]
            # The verifier looks at the working directory: 1.0 exactly when the loop ran a submit call
            # (one whose arguments are a JSON object; the tool refuses others).
            submitted = any(name == "submit" and _json_object(arguments) for name, arguments in called)
            assert outcome.env_reward == (1.0 if submitted else 0.0), (called, outcome.env_reward)
            assert all(t.metadata["dialect"] == "openai_chat" for t in turns)
            assert outcome.tool_call_count == sum(
                len(t.response["choices"][0]["message"].get("tool_calls") or []) for t in turns
            )
            multi_turn.append(any(m.get("role") == "tool" for t in turns for m in t.request["messages"]))
        assert any(multi_turn), "no rollout sent a tool result back to the model"
    finally:
        trainer._stop_services()


@pytest.mark.timeout(600)
def test_a_failing_adapter_makes_its_rollouts_unscorable(tmp_path: Path) -> None:
    trainer = HarnessAsyncGRPOTrainer(
        str(submit_task.task_model_path()),
        SubmitTaskSessionFactory,
        _args(tmp_path, steps=1),
        submit_task.dataset(),
        harness_adapter=BrokenLoop(),
    )
    trainer.train()
    (entry,) = trainer.state.log_history
    assert entry["rollout/unscorable_frac"] == 1.0 and entry["rollout/errors"] == 4
    assert entry["skipped_no_signal"] == 1.0


def test_an_object_without_run_white_box_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="run_white_box"):
        HarnessAsyncGRPOTrainer(
            str(submit_task.task_model_path()),
            SubmitTaskSessionFactory,
            _args(tmp_path, steps=1),
            submit_task.dataset(),
            harness_adapter=object(),  # type: ignore[arg-type]
        )


def test_a_factory_that_fails_to_build_fails_the_construction(tmp_path: Path) -> None:
    def missing_agent(**kwargs: Any) -> Any:
        raise FileNotFoundError("opencode is not installed; run launchers/install_agents.sh")

    with pytest.raises(FileNotFoundError, match="install_agents"):
        HarnessAsyncGRPOTrainer(
            str(submit_task.task_model_path()), missing_agent, _args(tmp_path, steps=1), submit_task.dataset()
        )


def test_a_factory_without_create_is_refused_naming_it(tmp_path: Path) -> None:
    def no_create(**kwargs: Any) -> Any:
        return object()

    with pytest.raises(SessionContractError, match=r"no_create.*no create"):
        HarnessAsyncGRPOTrainer(
            str(submit_task.task_model_path()), no_create, _args(tmp_path, 1), submit_task.dataset()
        )


class UnbindableFactory(SubmitTaskSessionFactory):
    """A trainer-bound factory whose binding fails (say, its sandbox backend is missing)."""

    def bind_rollout(self, context: Any) -> None:
        raise FileNotFoundError("bwrap is not installed")

    def create_from_row(self, row: Any, *, seed: int, episode_id: str) -> Any:
        raise AssertionError("never reached")


@pytest.mark.timeout(300)
def test_a_failed_start_stops_every_service_it_started(tmp_path: Path) -> None:
    before = {thread.name for thread in threading.enumerate()}
    trainer = HarnessAsyncGRPOTrainer(
        str(submit_task.task_model_path()), UnbindableFactory, _args(tmp_path, steps=1), submit_task.dataset()
    )
    with pytest.raises(FileNotFoundError, match="bwrap"):
        trainer.train()
    assert trainer.services is not None and trainer.services.loop is None  # stopped
    ours = ("harness-services", "engine-compute", "rollout")
    left = {thread.name for thread in threading.enumerate() if thread.name.startswith(ours)} - before
    assert not left, f"threads left running: {left}"
