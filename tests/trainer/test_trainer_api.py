"""The trainer as TRL users write it: one import path, the factory handshake, defaults, epochs, injection."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import harness_grpo
from examples import submit_task
from examples.white_box_submit import SubmitTaskSessionFactory, SubmitToolLoop
from harness_grpo import HarnessAsyncGRPOTrainer, HarnessGRPOConfig
from harness_grpo.engine.embedded import EmbeddedEngine
from harness_grpo.weight_transports import EmbeddedWeightSync


def _args(tmp_path: Path, **kw: Any) -> HarnessGRPOConfig:
    defaults = dict(output_dir=str(tmp_path), num_generations=2, save_strategy="no", report_to=[], disable_tqdm=True)
    return HarnessGRPOConfig(**{**defaults, **kw})


def test_the_public_api_is_one_import_and_costs_nothing_until_used() -> None:
    for name in harness_grpo.__all__:
        assert getattr(harness_grpo, name) is not None
    code = "import sys, harness_grpo, harness_grpo.engine; print('harness_grpo.trainer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_missing_dependency_names_itself_and_the_interpreter_to_use() -> None:
    """An interpreter without the dependencies (here: numpy made unimportable) says what to run instead."""
    code = "import sys; sys.modules['numpy'] = None\nfrom harness_grpo import HarnessAsyncGRPOTrainer"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: harness_grpo.HarnessAsyncGRPOTrainer needs 'numpy'")
    assert sys.executable in last and "launchers/setup.sh" in last


def test_async_grpo_defaults() -> None:
    args = HarnessGRPOConfig(output_dir="unused")
    assert (args.learning_rate, args.lr_scheduler_type.value, args.logging_steps) == (1e-6, "constant", 1)
    assert args.loss_weighting == "token" and args.max_steps == -1
    with pytest.raises(ValueError, match="top_p"):
        HarnessGRPOConfig(output_dir="unused", top_p=0.9)


class RecordingFactory(SubmitTaskSessionFactory):
    calls: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **kwargs: Any) -> None:
        RecordingFactory.calls.append(kwargs)
        super().__init__(**kwargs)


def test_the_factory_is_built_once_with_the_whole_sampling_policy_only(tmp_path: Path) -> None:
    RecordingFactory.calls = []
    HarnessAsyncGRPOTrainer(
        str(submit_task.task_model_path()), RecordingFactory, _args(tmp_path, temperature=0.7), submit_task.dataset()
    )
    assert RecordingFactory.calls == [
        {"sampling": {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}}
    ]


def test_without_max_steps_a_run_is_epochs_over_the_dataset(tmp_path: Path) -> None:
    dataset = submit_task.dataset()  # 8 rows
    args = _args(tmp_path, num_train_epochs=2, groups_per_step=2)
    trainer = HarnessAsyncGRPOTrainer(str(submit_task.task_model_path()), SubmitTaskSessionFactory, args, dataset)
    assert trainer.max_steps == 8 and trainer.state.max_steps == 8
    args = _args(tmp_path, max_steps=3)
    trainer = HarnessAsyncGRPOTrainer(str(submit_task.task_model_path()), SubmitTaskSessionFactory, args, dataset)
    assert trainer.max_steps == 3


@pytest.mark.skipif(importlib.util.find_spec("kernels") is None, reason="Hub kernels need kernels")
def test_the_trained_the_reference_and_the_served_model_use_no_hub_kernels(tmp_path: Path) -> None:
    """With ``kernels`` installed, transformers 5.25+ turns Hub kernels on by default; on a GPU ``train()`` then
    swaps layers for code fetched from the Hub (an offline machine failed its first step so)."""
    path = str(submit_task.task_model_path())
    trainer = HarnessAsyncGRPOTrainer(path, SubmitTaskSessionFactory, _args(tmp_path, beta=0.1), submit_task.dataset())
    assert trainer.reference is not None
    assert not trainer.model.use_kernels and not trainer.reference.use_kernels
    assert not EmbeddedEngine(path).model.use_kernels


def test_rows_without_a_prompt_are_refused_for_a_third_party_factory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'prompt'"):
        HarnessAsyncGRPOTrainer(
            str(submit_task.task_model_path()), SubmitTaskSessionFactory, _args(tmp_path), [{"task": "x"}]
        )


class CountingSync(EmbeddedWeightSync):
    """The in-process transport, counting the syncs the trainer asked of it."""

    def __init__(self) -> None:
        super().__init__(None, timeout_s=60)
        self.models: list[dict[str, torch.Tensor]] = []

    def _push(self, state: dict[str, torch.Tensor], new_version: int) -> None:
        self.models.append(state)


@pytest.mark.timeout(600)
def test_an_injected_weight_transport_is_the_one_used(tmp_path: Path) -> None:
    sync = CountingSync()
    trainer = HarnessAsyncGRPOTrainer(
        str(submit_task.task_model_path()),
        SubmitTaskSessionFactory,
        _args(tmp_path, max_steps=2, num_generations=2, max_completion_length=32, max_tool_calling_iterations=2),
        submit_task.dataset(),
        harness_adapter=SubmitToolLoop(),
        weight_sync=sync,
    )
    trainer.train()
    assert len(sync.models) == 2 and sync.version == 2 and trainer.state.policy_version == 2
    with pytest.raises(TypeError, match="missing sync, close"):
        HarnessAsyncGRPOTrainer(
            str(submit_task.task_model_path()),
            SubmitTaskSessionFactory,
            _args(tmp_path),
            submit_task.dataset(),
            weight_sync=type("NoSync", (), {"version": 0})(),  # type: ignore[arg-type]
        )
