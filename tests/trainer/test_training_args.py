"""Every ``TrainingArguments`` setting works or is refused at construction (``harness_grpo.training_args``).

Each honoured setting is shown changing what a step does, on the real trainer: its optimizer step
(``_optimize``) on synthetic rows, or its real step loop with the rollout side replaced by synthetic
rows (``SyntheticRun``: no engine, proxy or agents; the loop, callbacks, checkpoints, resume and Hub
pushes are the trainer's own). One white-box run checks the callbacks on real rollouts. A setting
that is not honoured is refused with a ``ValueError`` naming it, and every ``TrainingArguments``
field of the installed transformers is in exactly one of the honoured/harmless/refused tables.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from huggingface_hub import HfApi
from transformers import AutoModelForCausalLM, TrainerCallback, TrainingArguments
from transformers.integrations import TensorBoardCallback
from transformers.optimization import Adafactor

from examples import submit_task
from examples.white_box_submit import SubmitTaskSessionFactory, SubmitToolLoop
from harness_grpo.checkpoints import TRAINER_STATE
from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.rows import Row
from harness_grpo.services import TrainerServices
from harness_grpo.tiny_model import tiny_model_path
from harness_grpo.trainer import HarnessAsyncGRPOTrainer
from harness_grpo.training_args import HARMLESS, HONOURED, UNSUPPORTED
from tests.support.rows import scored_rows

REPO = Path(__file__).resolve().parents[2]
DATASET = [{"prompt": f"task {i}"} for i in range(2)]


def _args(tmp_path: Path, **overrides: Any) -> HarnessGRPOConfig:
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path / "run"),
        "max_steps": 4,
        "learning_rate": 1e-3,
        "optim": "adamw_torch",
        "num_generations": 2,
        "max_tokens_per_microbatch": 64,  # the synthetic rows below: two micro-batches per step
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "use_cpu": True,
    }
    return HarnessGRPOConfig(**{**settings, **overrides})


def _trainer(tmp_path: Path, *, model: Any = None, callbacks: Any = None, **overrides: Any) -> HarnessAsyncGRPOTrainer:
    args = _args(tmp_path, **overrides)
    model = model if model is not None else str(tiny_model_path())
    return HarnessAsyncGRPOTrainer(model, SubmitTaskSessionFactory, args, DATASET, callbacks=callbacks)


def _rows(seed: int = 0, vocab: int = 8192) -> list[Row]:
    """Two rollouts' rows, advantages +1 and -1 (a step with signal), 40 tokens each."""
    return scored_rows([(40, 1.0), (40, -1.0)], seed=seed, vocab=vocab, context=10)


def _params(trainer: HarnessAsyncGRPOTrainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _update_norm(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(((after[n] - before[n]) ** 2).sum() for n in before)))


# --- the allow-list ------------------------------------------------------------------------------------------------


def test_every_training_arguments_field_is_in_exactly_one_table() -> None:
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    tables = {"HONOURED": set(HONOURED), "HARMLESS": set(HARMLESS), "UNSUPPORTED": set(UNSUPPORTED)}
    for (a, left), (b, right) in itertools.combinations(tables.items(), 2):
        assert not left & right, f"in both {a} and {b}: {left & right}"
    classified = set().union(*tables.values())
    assert fields - classified == set(), "fields this transformers has that nobody has decided about"
    assert classified - fields == set(), "tables name fields this transformers does not have"


def test_the_defaults_the_launcher_and_the_tests_configs_construct(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "launchers"))
    try:
        import train
    finally:
        sys.path.remove(str(REPO / "launchers"))
    HarnessGRPOConfig(output_dir=str(tmp_path))
    _, args = train.parse(["--output_dir", str(tmp_path)])
    assert args.save_total_limit == 2 and args.report_to == [] and args.lr_scheduler_type == "constant"
    _, args = train.parse(["--output_dir", str(tmp_path), "--harness", "terminus-2"])
    assert args.num_generations == 4
    _, args = train.parse(["--output_dir", str(tmp_path), "--report_to", "tensorboard", "--save_strategy", "no"])
    assert args.report_to == ["tensorboard"]


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"per_device_train_batch_size": 4}, ["per_device_train_batch_size", "groups_per_step"]),
        ({"gradient_accumulation_steps": 2}, ["gradient_accumulation_steps", "max_tokens_per_microbatch"]),
        ({"eval_strategy": "steps", "eval_steps": 5}, ["eval_strategy", "eval_steps", "no evaluation loop"]),
        ({"do_eval": True}, ["do_eval", "no evaluation loop"]),
        ({"load_best_model_at_end": True}, ["load_best_model_at_end"]),
        ({"deepspeed": "ds_config.json"}, ["deepspeed"]),
        ({"fsdp": "full_shard"}, ["fsdp", "accelerate launch"]),
        ({"torch_compile": True}, ["torch_compile"]),
        ({"label_smoothing_factor": 0.1}, ["label_smoothing_factor", "no labels"]),
        ({"use_liger_kernel": True}, ["use_liger_kernel"]),
        ({"dataloader_num_workers": 2}, ["dataloader_num_workers", "DataLoader"]),
        ({"average_tokens_across_devices": False}, ["average_tokens_across_devices"]),
        ({"save_only_model": True}, ["save_only_model"]),
        ({"save_strategy": "best"}, ["save_strategy='best'"]),
        ({"train_sampling_strategy": "random"}, ["train_sampling_strategy='random'", "dataset order"]),
        ({"warmup_steps": 3}, ["warmup_steps=3", "'constant' has no warm-up"]),
        ({"optim": "lomo"}, ["optim='lomo'"]),
        ({"optim": "galore_adamw_layerwise"}, ["optim='galore_adamw_layerwise'"]),
        ({"optim": "not_an_optimizer"}, ["optim='not_an_optimizer'", "adamw_torch"]),
        ({"per_device_train_batch_size": 4, "debug": "underflow_overflow"}, ["per_device_train_batch_size", "debug"]),
    ],
)
def test_a_setting_that_is_not_honoured_is_refused_naming_it(
    tmp_path: Path, settings: dict[str, Any], named: list[str]
) -> None:
    with pytest.raises(ValueError) as refused:
        _args(tmp_path, **settings)
    for text in named:
        assert text in str(refused.value), str(refused.value)


def test_a_setting_changed_after_construction_is_refused_by_the_trainer(tmp_path: Path) -> None:
    args = _args(tmp_path)
    args.gradient_accumulation_steps = 4
    with pytest.raises(ValueError, match="gradient_accumulation_steps=4"):
        HarnessAsyncGRPOTrainer(str(tiny_model_path()), SubmitTaskSessionFactory, args, DATASET)


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is allowed with a CUDA GPU")
def test_fp16_without_a_gpu_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fp16=True: fp16 mixed precision needs a CUDA GPU"):
        _args(tmp_path, fp16=True)


# --- optimizer and schedule ----------------------------------------------------------------------------------------


def test_optim_and_optim_args_choose_the_optimizer_over_transformers_parameter_groups(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, optim="sgd", optim_args="momentum=0.9,nesterov=true", weight_decay=0.1)
    optimizer = trainer.optimizer.optimizer  # accelerate's wrapper around it
    assert type(optimizer) is torch.optim.SGD
    decay, no_decay = optimizer.param_groups
    assert decay["momentum"] == 0.9 and decay["nesterov"] is True
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    model = trainer.accelerator.unwrap_model(trainer.model)
    names = {id(p): name for name, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert no_decay_names and all("norm" in name for name in no_decay_names), no_decay_names
    assert "model.norm.weight" in no_decay_names and "model.layers.0.input_layernorm.weight" in no_decay_names
    before = _params(trainer)
    trainer._optimize(_rows())
    assert _update_norm(before, _params(trainer)) > 0

    trainer = _trainer(tmp_path, optim="adafactor")
    assert type(trainer.optimizer.optimizer) is Adafactor
    before = _params(trainer)
    trainer._optimize(_rows())
    assert _update_norm(before, _params(trainer)) > 0


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_an_optimizer_whose_package_is_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"optim='adamw_bnb_8bit'.*can't be built.*bitsandbytes"):
        _trainer(tmp_path, optim="adamw_bnb_8bit")


def test_weight_decay_shrinks_the_decayed_parameters_and_only_them(tmp_path: Path) -> None:
    """AdamW's decoupled decay: a step with decay lands lr * wd * p below the same step without, for the
    decay group; norms (transformers' no-decay group) take exactly the same step either way."""
    lr, wd = 1e-2, 0.5
    start = _params(_trainer(tmp_path, learning_rate=lr))
    after = {}
    for decay in (0.0, wd):
        trainer = _trainer(tmp_path, learning_rate=lr, weight_decay=decay)
        trainer._optimize(_rows())
        after[decay] = _params(trainer)
    for name, p0 in start.items():
        gap = after[0.0][name] - after[wd][name]
        if "norm" in name:
            assert torch.equal(gap, torch.zeros_like(gap)), f"{name} decayed"
        else:
            assert torch.allclose(gap, lr * wd * p0, rtol=1e-3, atol=1e-8), f"{name} did not decay by lr*wd*p"


def test_max_grad_norm_clips_the_update(tmp_path: Path) -> None:
    """With SGD at lr 1 the update is the gradient: unclipped its norm is the logged grad_norm; clipped to
    1e-3 it is 1e-3, while grad_norm still reports the norm before clipping."""
    norms = {}
    for max_grad_norm in (0.0, 1e-3):
        trainer = _trainer(tmp_path, optim="sgd", learning_rate=1.0, max_grad_norm=max_grad_norm)
        before = _params(trainer)
        metrics = trainer._optimize(_rows())
        norms[max_grad_norm] = (_update_norm(before, _params(trainer)), metrics["grad_norm"])
    (free, grad_norm), (clipped, grad_norm_clipped) = norms[0.0], norms[1e-3]
    assert grad_norm > 0.01
    assert free == pytest.approx(grad_norm, rel=1e-3)
    assert clipped == pytest.approx(1e-3, rel=1e-2)
    assert grad_norm_clipped == pytest.approx(grad_norm, rel=1e-5)


@pytest.mark.parametrize(("warmup_steps", "schedule"), [(2, "constant_with_warmup"), (0.5, "linear")])
def test_warmup_ramps_the_learning_rate(tmp_path: Path, warmup_steps: float, schedule: str) -> None:
    trainer = _trainer(tmp_path, learning_rate=1e-3, lr_scheduler_type=schedule, warmup_steps=warmup_steps)
    rates = [trainer._optimize(_rows(step))["learning_rate"] for step in range(4)]
    expected = {"constant_with_warmup": [0.0, 5e-4, 1e-3, 1e-3], "linear": [0.0, 5e-4, 1e-3, 5e-4]}[schedule]
    assert rates == pytest.approx(expected)


# --- precision, checkpointing, seed --------------------------------------------------------------------------------


def _output_dtypes(trainer: HarnessAsyncGRPOTrainer) -> tuple[list[torch.dtype], Any]:
    """Records the dtype of the first decoder layer's MLP output in each forward."""
    seen: list[torch.dtype] = []
    model = trainer.accelerator.unwrap_model(trainer.model)
    handle = model.model.layers[0].mlp.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    return seen, handle


def test_bf16_runs_the_forward_in_bf16_autocast_on_fp32_weights(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, bf16=True)
    assert trainer.accelerator.mixed_precision == "bf16"
    seen, handle = _output_dtypes(trainer)
    before = _params(trainer)
    metrics = trainer._optimize(_rows())
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert torch.isfinite(torch.tensor(metrics["loss"])) and _update_norm(before, _params(trainer)) > 0
    assert all(p.dtype == torch.float32 for p in _params(trainer).values())

    plain = _trainer(tmp_path)
    seen, handle = _output_dtypes(plain)
    plain._optimize(_rows())
    handle.remove()
    assert plain.accelerator.mixed_precision == "no" and set(seen) == {torch.float32}


def test_gradient_checkpointing_recomputes_the_layers_and_leaves_the_step_unchanged(tmp_path: Path) -> None:
    results = {}
    for checkpointing in (False, True):
        extra = {"gradient_checkpointing_kwargs": {"use_reentrant": False}} if checkpointing else {}
        trainer = _trainer(tmp_path, gradient_checkpointing=checkpointing, **extra)
        model = trainer.accelerator.unwrap_model(trainer.model)
        assert model.is_activation_checkpointing is checkpointing
        calls: list[int] = []
        # Inside the checkpointed layer (transformers checkpoints the layer's forward, its own hooks stay outside),
        # and a pre-hook: the recompute stops once it has what the backward needs, before the MLP returns.
        handle = model.model.layers[0].mlp.register_forward_pre_hook(lambda *_, seen=calls: seen.append(1))
        metrics = trainer._optimize(_rows())
        handle.remove()
        results[checkpointing] = (len(calls), metrics["loss"], metrics["grad_norm"])
    (plain_calls, plain_loss, plain_norm), (ckpt_calls, ckpt_loss, ckpt_norm) = results[False], results[True]
    assert plain_calls == 2 and ckpt_calls == 4  # two micro-batches; recomputed in each backward
    assert ckpt_loss == pytest.approx(plain_loss, rel=1e-5) and ckpt_norm == pytest.approx(plain_norm, rel=1e-4)


def test_the_seed_fixes_the_training_randomness(tmp_path: Path) -> None:
    """With attention dropout on, a step's loss depends on torch's RNG, which the trainer seeds from ``seed``."""

    def first_loss(seed: int) -> float:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), attention_dropout=0.3)
        return _trainer(tmp_path, model=model, seed=seed)._optimize(_rows())["loss"]

    assert first_loss(0) == first_loss(0)
    assert first_loss(0) != first_loss(1)


# --- the step loop: callbacks, control, checkpoints, resume, Hub ---------------------------------------------------


class CountingSync:
    """A weight sync that only counts versions."""

    def __init__(self, version: int) -> None:
        self.version = version

    def sync(self, model: Any) -> int:
        self.version += 1
        return self.version

    def close(self) -> None:
        pass


class SyntheticProducer:
    """Hands out one group per dataset row in order, like ``RolloutProducer``, without running anything."""

    def __init__(self, start_position: int) -> None:
        self.start_position = self.position = start_position
        self.dropped_stale = 0

    def take(self, n: int, **_: Any) -> list[Any]:
        groups = [SimpleNamespace(row_index=self.position + i, outcomes=[]) for i in range(n)]
        self.position += n
        return groups

    def stop(self) -> None:
        pass


class SyntheticRun(HarnessAsyncGRPOTrainer):
    """The trainer's own step loop with the rollout side replaced: every step trains on ``_rows``."""

    def _start_services(self) -> None:
        self.services = TrainerServices(weight_sync=CountingSync(self.state.policy_version))

    def _start_producer(self) -> Any:
        self.producer = SyntheticProducer(self.state.dataset_position)
        return self.producer

    def _rows_and_metrics(
        self, groups: list[Any], scores: list[Any], turn_rewards: Any = None
    ) -> tuple[list[Row], dict[str, float]]:
        return _rows(groups[0].row_index), {"reward": 0.5}


def _run(tmp_path: Path, *, callbacks: Any = None, dataset: Any = DATASET, **overrides: Any) -> SyntheticRun:
    args = _args(tmp_path, **overrides)
    return SyntheticRun(str(tiny_model_path()), SubmitTaskSessionFactory, args, dataset, callbacks=callbacks)


class Recorder(TrainerCallback):
    """Records every event with the step it came at."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda args, state, control, **kwargs: self.events.append((name, state.global_step))
        return super().__getattribute__(name)


def test_a_callback_sees_every_event_of_the_loop(tmp_path: Path) -> None:
    """Two dataset rows, one per step: passes over the dataset end after steps 2 and 4 (the epochs)."""
    recorder = Recorder()
    trainer = _run(tmp_path, callbacks=[recorder], max_steps=3, save_strategy="steps", save_steps=2)
    trainer.train()
    step = [
        "on_step_begin",
        "on_substep_end",
        "on_pre_optimizer_step",
        "on_optimizer_step",
        "on_step_end",
        "on_log",
    ]
    assert [name for name, _ in recorder.events] == [
        "on_init_end",
        "on_train_begin",
        "on_epoch_begin",
        *step,
        *step,
        "on_save",
        "on_epoch_end",
        "on_epoch_begin",
        *step,
        "on_save",  # the last step: DefaultFlowCallback saves at the end of a run
        "on_epoch_end",  # stopped inside the second pass: it ends with the run
        "on_train_end",
    ]
    assert [step for name, step in recorder.events if name == "on_save"] == [2, 3]
    assert [step for name, step in recorder.events if name == "on_epoch_end"] == [2, 3]
    assert sorted(p.name for p in Path(trainer.args.output_dir).glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-3",
    ]
    assert [entry["epoch"] for entry in trainer.state.log_history] == [0.5, 1.0, 1.5]


class Steering(TrainerCallback):
    """Saves after step 1, logs after step 2, stops after step 3, through ``TrainerControl``."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        control.should_save = state.global_step == 1
        control.should_log = state.global_step == 2
        control.should_training_stop = state.global_step == 3
        return control


def test_the_loop_honours_what_callbacks_set_in_control(tmp_path: Path) -> None:
    trainer = _run(
        tmp_path, callbacks=[Steering], max_steps=6, logging_strategy="no", logging_first_step=False, save_strategy="no"
    )
    trainer.train()
    assert trainer.state.global_step == 3
    assert [entry["step"] for entry in trainer.state.log_history] == [2]
    assert [p.name for p in Path(trainer.args.output_dir).glob("checkpoint-*")] == ["checkpoint-1"]


def test_logging_steps_and_num_input_tokens_seen(tmp_path: Path) -> None:
    trainer = _run(
        tmp_path, max_steps=4, logging_steps=2, logging_first_step=False, include_num_input_tokens_seen="non_padding"
    )
    trainer.train()
    assert [entry["step"] for entry in trainer.state.log_history] == [2, 4]
    assert [entry["num_input_tokens_seen"] for entry in trainer.state.log_history] == [160, 320]  # 2 x 40 a step


def test_save_strategy_epoch_and_save_total_limit(tmp_path: Path) -> None:
    trainer = _run(tmp_path, max_steps=6, save_strategy="epoch", save_total_limit=2)
    trainer.train()
    assert sorted(p.name for p in Path(trainer.args.output_dir).glob("checkpoint-*")) == [
        "checkpoint-4",
        "checkpoint-6",
    ]

    trainer = _run(
        tmp_path, max_steps=4, save_strategy="steps", save_steps=1, save_total_limit=2, output_dir=str(tmp_path / "b")
    )
    trainer.train()
    assert sorted(p.name for p in (tmp_path / "b").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]


def test_resume_from_checkpoint_in_the_arguments(tmp_path: Path) -> None:
    dataset = [{"prompt": f"task {i}"} for i in range(3)]
    first = _run(tmp_path, dataset=dataset, max_steps=2, save_strategy="steps", save_steps=2)
    first.train()
    saved = json.loads((Path(first.args.output_dir) / "checkpoint-2" / TRAINER_STATE).read_text())
    assert (saved["global_step"], saved["policy_version"], saved["dataset_position"]) == (2, 2, 2)

    for resume in (True, "true", str(Path(first.args.output_dir) / "checkpoint-2")):
        again = _run(tmp_path, dataset=dataset, max_steps=4, resume_from_checkpoint=resume)
        again.train()
        assert again.producer.start_position == 2
        assert [entry["step"] for entry in again.state.log_history] == [1, 2, 3, 4]
        assert again.state.policy_version == 2 + 1 + 2  # the resume pushes the checkpoint's weights once

    skip = _run(tmp_path, dataset=dataset, max_steps=4, resume_from_checkpoint=True, ignore_data_skip=True)
    skip.train()
    assert skip.producer.start_position == 0  # the pass over the three rows starts again

    with pytest.raises(ValueError, match="resume_from_checkpoint=True: no checkpoint"):
        _run(tmp_path, max_steps=1, resume_from_checkpoint=True, output_dir=str(tmp_path / "empty")).train()


def test_report_to_adds_transformers_reporting_callbacks(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, report_to=["tensorboard"])
    assert any(isinstance(cb, TensorBoardCallback) for cb in trainer.callback_handler.callbacks)


class FakeHub:
    """Stands in for the Hub: records ``HfApi`` calls and what each uploaded folder held at the time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[dict[str, Any]] = []
        hub = self

        def create_repo(api: HfApi, repo_id: str, **kwargs: Any) -> Any:
            hub.calls.append({"call": "create_repo", "repo_id": repo_id, "token": api.token, **kwargs})
            return SimpleNamespace(repo_id=repo_id)

        def upload_folder(api: HfApi, **kwargs: Any) -> None:
            folder = Path(kwargs["folder_path"])
            files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
            hub.calls.append({"call": "upload_folder", "token": api.token, "files": files, **kwargs})

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)


@pytest.mark.parametrize("strategy", ["every_save", "checkpoint", "all_checkpoints", "end"])
def test_push_to_hub_pushes_checkpoints_by_strategy_and_the_final_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    hub = FakeHub(monkeypatch)
    trainer = _run(
        tmp_path,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        push_to_hub=True,
        hub_model_id="someone/grpo-run",
        hub_token="hf_secret",
        hub_private_repo=True,
        hub_strategy=strategy,
    )
    trainer.train()
    out = Path(trainer.args.output_dir)
    assert hub.calls[0] == {
        "call": "create_repo",
        "repo_id": "someone/grpo-run",
        "token": "hf_secret",
        "private": True,
        "exist_ok": True,
    }
    uploads = [(c["folder_path"], c.get("path_in_repo"), c["commit_message"]) for c in hub.calls[1:]]
    expected = []
    for step in (1, 2):
        if strategy != "end":
            expected.append((str(out), None, f"Training in progress, step {step}"))
        if strategy in ("checkpoint", "all_checkpoints"):
            where = "last-checkpoint" if strategy == "checkpoint" else f"checkpoint-{step}"
            expected.append((str(out / f"checkpoint-{step}"), where, f"Training in progress, step {step}, checkpoint"))
    expected.append((str(out), None, "End of training"))
    assert uploads == expected
    for call in hub.calls[1:]:
        assert call["repo_id"] == "someone/grpo-run" and call["token"] == "hf_secret"
        if call["folder_path"] == str(out):  # the model at the repository's root, never checkpoints or journals
            assert "model.safetensors" in call["files"] and "config.json" in call["files"]
            ignored = call["ignore_patterns"]
            assert "checkpoint-*" in ignored and "proxy_journal/*" in ignored
        else:  # a checkpoint folder: everything resuming needs
            assert TRAINER_STATE in call["files"] and any(f.startswith("accelerate_state/") for f in call["files"])


# --- a real run ----------------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_callbacks_see_the_events_of_a_real_white_box_run(tmp_path: Path) -> None:
    rewards = itertools.cycle([0.0, 1.0])  # a step with signal whatever the rollouts do
    recorder = Recorder()
    args = HarnessGRPOConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        learning_rate=3e-4,
        num_generations=4,
        max_completion_length=32,
        max_tool_calling_iterations=2,
        rollout_timeout_s=120,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        bf16=True,
        gradient_checkpointing=True,
    )
    trainer = HarnessAsyncGRPOTrainer(
        str(submit_task.task_model_path()),
        SubmitTaskSessionFactory,
        args,
        submit_task.dataset(),
        rollout_reward_fn=lambda outcome: next(rewards),
        harness_adapter=SubmitToolLoop(),
        callbacks=[recorder],
    )
    trainer.train()
    names = [name for name, _ in recorder.events]
    for name in ("on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_pre_optimizer_step"):
        assert name in names
    assert names[-4:] == ["on_step_end", "on_log", "on_epoch_end", "on_train_end"]
    assert names.index("on_optimizer_step") > names.index("on_step_begin")
    (entry,) = trainer.state.log_history
    assert "skipped_no_signal" not in entry and entry["policy_version"] == 1.0


def test_an_unknown_advantage_baseline_is_refused(tmp_path: Path) -> None:
    assert _args(tmp_path, advantage_baseline="batch").advantage_baseline == "batch"
    with pytest.raises(ValueError, match=r"advantage_baseline must be one of \('group', 'batch'\), not 'global'"):
        _args(tmp_path, advantage_baseline="global")
