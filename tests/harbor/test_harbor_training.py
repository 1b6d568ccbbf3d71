"""The trainer takes steps on Harbor sessions: each rollout a real opencode trial in the local sandbox.

``HarnessAsyncGRPOTrainer`` builds ``HarborTrialSessionFactory`` with its sampling policy, binds its own proxy and
embedded engine (the warm-started tiny model) and runs two steps on two example tasks, each rollout one Harbor
trial whose verifier gives the reward.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from harness_grpo.agents import SMALL_MODEL_PROMPT, agent_binary
from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.harbor_sessions import HarborTrialSessionFactory
from harness_grpo.harbor_tasks import load_task_dataset
from harness_grpo.tiny_model.warm_start import warm_tiny_model_path
from harness_grpo.trainer import HarnessAsyncGRPOTrainer

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
@pytest.mark.skipif(agent_binary("opencode") is None, reason="opencode is not installed")
def test_the_trainer_steps_on_harbor_trials(tmp_path: Path) -> None:
    args = HarnessGRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        num_generations=2,
        groups_per_step=1,
        max_staleness=1,
        temperature=1.0,
        max_completion_length=64,
        max_model_calls=2,
        rollout_timeout_s=120,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
    )
    factory = functools.partial(HarborTrialSessionFactory, harness="opencode", system_prompt=SMALL_MODEL_PROMPT)
    dataset = load_task_dataset(REPO / "examples" / "tasks").select(range(2))
    trainer = HarnessAsyncGRPOTrainer(str(warm_tiny_model_path()), factory, args, dataset)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "rewards/harness_reward/mean" in entry]
    assert len(logged) == 2
    for entry in logged:  # every rollout a trial its task's verifier graded (the tiny model solves none)
        assert entry["rollout/errors"] == 0 and entry["rollout/unscorable_frac"] == 0, entry
        assert entry["rewards/harness_reward/mean"] == 0.0 and entry["rollout/turns_mean"] >= 1, entry
