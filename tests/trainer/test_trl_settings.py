"""TRL's GRPOConfig / AsyncGRPOConfig names on HarnessGRPOConfig: each works as in TRL or is refused, saying why."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from transformers import HfArgumentParser

from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.loss import LossConfig, grpo_loss
from harness_grpo.packing import MicroBatch, pack_rows
from harness_grpo.rows import rollout_rows
from harness_grpo.trl_settings import REFUSED, apply_trl_settings
from proxy.capture_graph import AGENT, TrainingSequence


def config(**kw: Any) -> HarnessGRPOConfig:
    return HarnessGRPOConfig(output_dir="unused", report_to=[], **kw)


def refused(match: str, **kw: Any) -> None:
    with pytest.raises(ValueError, match=match):
        config(**kw)


def test_trl_engine_names_choose_the_engine() -> None:
    embedded = config()
    assert embedded.use_vllm is False and embedded.vllm_server_base_url is None
    assert config(use_vllm=False).vllm_server_base_url is None
    # colocate on CPU: the engine in the trainer process, i.e. the embedded engine
    colocated = config(use_vllm=True)
    assert colocated.vllm_mode == "colocate" and colocated.vllm_server_base_url is None
    # server: TRL's host/port defaults give AsyncGRPOConfig's default URL
    assert config(use_vllm=True, vllm_mode="server").vllm_server_base_url == "http://localhost:8000"
    assert (
        config(
            use_vllm=True, vllm_mode="server", vllm_server_host="10.0.0.2", vllm_server_port=9000
        ).vllm_server_base_url
        == "http://10.0.0.2:9000"
    )
    # our own name alone still means a vLLM server
    ours = config(vllm_server_base_url="http://gpu-box:8000")
    assert (ours.use_vllm, ours.vllm_mode, ours.vllm_server_base_url) == (True, "server", "http://gpu-box:8000")
    assert (
        config(use_vllm=True, vllm_mode="server", vllm_server_base_url="http://a:1").vllm_server_base_url
        == "http://a:1"
    )


def test_trl_engine_names_that_contradict_or_cannot_work_are_refused() -> None:
    refused("use_vllm=False asks for the embedded engine", use_vllm=False, vllm_server_base_url="http://a:1")
    refused(
        "vllm_mode='colocate' runs the engine in the trainer process", use_vllm=True, vllm_server_base_url="http://a:1"
    )
    refused("needs use_vllm=True", vllm_mode="server")
    refused("vllm_mode='remote'", vllm_mode="remote")
    refused("have no effect without use_vllm=True", vllm_server_port=9000)
    refused("disagree", use_vllm=True, vllm_mode="server", vllm_server_base_url="http://a:1", vllm_server_port=9000)
    # On a GPU, colocate would be vLLM inside the trainer: refused, saying what to use instead.
    args = config()
    args.use_vllm, args.vllm_mode = True, "colocate"
    with pytest.raises(ValueError, match=r"on a GPU would run vLLM inside the trainer process.*vllm_mode='server'"):
        apply_trl_settings(args, gpu=True)
    args = config()
    args.use_vllm, args.vllm_mode = True, "server"
    apply_trl_settings(args, gpu=True)  # a server is fine on a GPU
    assert args.vllm_server_base_url == "http://localhost:8000"


def test_trl_importance_sampling_names_set_the_loss() -> None:
    default = config()
    assert (default.importance_sampling, default.importance_sampling_cap) == ("token_tis", 2.0)
    truncate = config(vllm_importance_sampling_mode="token_truncate")
    assert (truncate.importance_sampling, truncate.importance_sampling_cap) == ("token_tis", 3.0)  # TRL's clip_max
    assert truncate.vllm_importance_sampling_clip_min is None
    mask = config(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=2.5)
    assert (mask.importance_sampling, mask.importance_sampling_cap) == ("token_mask", 2.5)
    assert mask.vllm_importance_sampling_clip_min == 0.0  # TRL's token_mask: no lower bound
    floor = config(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_min=0.5)
    assert floor.vllm_importance_sampling_clip_min == 0.5
    assert config(vllm_importance_sampling_correction=False).importance_sampling == "off"
    assert config(vllm_importance_sampling_cap=4.0).importance_sampling_cap == 4.0  # TRL's deprecated name
    assert config(importance_sampling="token_mask").vllm_importance_sampling_clip_min is None  # ours: [1/cap, cap]
    agreeing = config(importance_sampling="token_mask", vllm_importance_sampling_mode="token_mask")
    assert agreeing.importance_sampling == "token_mask"


def test_trl_importance_sampling_names_that_cannot_work_are_refused() -> None:
    refused("sequence-level importance sampling is not implemented", vllm_importance_sampling_mode="sequence_mask")
    refused("'token_truncate', 'token_mask'", vllm_importance_sampling_mode="token")
    refused(
        r"vllm_importance_sampling_mode/_correction asks for importance_sampling='token_mask', but "
        r"importance_sampling='off' is set",
        importance_sampling="off",
        vllm_importance_sampling_mode="token_mask",
    )
    refused(
        "importance_sampling_cap=5.0 is set",
        importance_sampling_cap=5.0,
        vllm_importance_sampling_clip_max=3.0,
    )
    refused("disagree", vllm_importance_sampling_cap=2.0, vllm_importance_sampling_clip_max=3.0)
    refused("must be >= 0 and below the cap", vllm_importance_sampling_clip_min=2.5)
    refused("no effect with importance sampling off", importance_sampling="off", vllm_importance_sampling_clip_min=0.5)


def _batch(behaviour: list[float]) -> MicroBatch:
    sequence = TrainingSequence([5, 6, 7, 8], [0, 1, 1, 1], [0.0, *behaviour], ["a"], AGENT)
    (batch,) = pack_rows(rollout_rows([sequence], 1.0, policy_version=0, rollout_id="r", group_id="g"), 64).microbatches
    return batch


def test_the_importance_sampling_bounds_reach_the_loss() -> None:
    """Token ratios rho = 0.2, 1, 4 (trainer logprob 0 against behaviour logprobs log(5), 0, log(1/4))."""
    batch = _batch([1.6094379, 0.0, -1.3862944])
    logprobs = torch.zeros(batch.input_ids.shape)

    def clipped(cfg: HarnessGRPOConfig) -> float:
        loss_config = LossConfig(
            importance_sampling=cfg.importance_sampling,
            is_cap=cfg.importance_sampling_cap,
            is_floor=cfg.vllm_importance_sampling_clip_min,
        )
        return grpo_loss(logprobs, batch, normalizer=3.0, config=loss_config)[1]["mismatch/tis_clipped_frac"]

    def loss(cfg: HarnessGRPOConfig) -> float:
        loss_config = LossConfig(
            importance_sampling=cfg.importance_sampling,
            is_cap=cfg.importance_sampling_cap,
            is_floor=cfg.vllm_importance_sampling_clip_min,
        )
        return float(grpo_loss(logprobs, batch, normalizer=3.0, config=loss_config)[0])

    # advantage 1 and ratio 1 against the anchor: each token's loss is -is_weight
    assert loss(config(vllm_importance_sampling_mode="token_truncate")) == pytest.approx(-(0.2 + 1 + 3) / 3)
    assert loss(
        config(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_min=0.5)
    ) == pytest.approx(-(0.5 + 1 + 3) / 3)
    assert loss(config(vllm_importance_sampling_mode="token_mask")) == pytest.approx(-(1 + 1) / 3)  # only 4 > 3 masked
    assert loss(config(importance_sampling="token_mask", importance_sampling_cap=3.0)) == pytest.approx(-1 / 3)
    assert clipped(config(importance_sampling="token_mask", importance_sampling_cap=3.0)) == pytest.approx(2 / 3)


def test_generation_batch_size_sizes_a_step() -> None:
    assert config(num_generations=4, generation_batch_size=12).groups_per_step == 3
    assert config(num_generations=4, generation_batch_size=12, groups_per_step=3).groups_per_step == 3
    assert config(steps_per_generation=1).groups_per_step == 1
    refused(
        r"generation_batch_size \(10\) must be a positive multiple of num_generations \(4\)",
        num_generations=4,
        generation_batch_size=10,
    )
    refused("can not be both configured", generation_batch_size=16, steps_per_generation=1)
    refused("steps_per_generation=4: every optimizer step trains on its own groups", steps_per_generation=4)
    refused(
        "generation_batch_size asks for groups_per_step=2",
        num_generations=4,
        generation_batch_size=8,
        groups_per_step=3,
    )


def test_trl_aliases_of_our_settings() -> None:
    args = config(
        max_inflight_tasks=12, token_budget=4096, weight_sync_timeout=99, loss_type="dapo", scale_rewards="none"
    )
    assert (args.max_concurrent_rollouts, args.max_tokens_per_microbatch, args.weight_sync_timeout_s) == (
        12,
        4096,
        99.0,
    )
    assert args.loss_weighting == "token" and args.scale_rewards is False
    assert config(scale_rewards="group").scale_rewards is True
    trl_sampling = config(top_k=0, min_p=None)  # TRL's sampling defaults
    assert trl_sampling.sampling_policy() == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    refused("token_budget=0: fixed-count packing is not implemented", token_budget=0)
    refused("loss_type='grpo': only 'dapo'", loss_type="grpo")
    refused("loss_type='dapo' asks for loss_weighting='token'", loss_type="dapo", loss_weighting="rollout")
    refused("max_inflight_tasks asks for max_concurrent_rollouts=20", max_inflight_tasks=20, max_concurrent_rollouts=30)
    refused("'batch' is not implemented", scale_rewards="batch")
    refused("use_bias_correction_kl=True: the KL term", beta=0.1, use_bias_correction_kl=True)
    assert config(use_bias_correction_kl=True).beta == 0.0  # harmless without a KL term


def test_every_refused_trl_name_is_refused_when_set_and_accepted_at_trl_default() -> None:
    defaults = config()
    changed = {"bool": lambda v: not v, "str": lambda v: f"{v}-other", "NoneType": lambda v: 7}
    for name, (default, why, also) in REFUSED.items():
        assert getattr(defaults, name) == default
        for accepted in also:
            assert getattr(config(**{name: accepted}), name) == accepted
        value = changed.get(type(default).__name__, lambda v: v + 1)(default)
        with pytest.raises(ValueError, match=f"{name}={value!r}".replace("(", r"\(").replace(")", r"\)")) as info:
            config(**{name: value})
        assert why in str(info.value)
    # all problems at once, each named
    with pytest.raises(ValueError) as info:
        config(num_iterations=2, entropy_coef=0.1, vllm_importance_sampling_mode="sequence_mask")
    assert all(name in str(info.value) for name in ("num_iterations", "entropy_coef", "sequence_mask"))


def test_trl_names_parse_from_flags_and_a_resolved_config_builds_again() -> None:
    parser = HfArgumentParser(HarnessGRPOConfig)
    (args,) = parser.parse_args_into_dataclasses(
        [
            "--output_dir", "unused", "--report_to", "none",
            "--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_port", "8001",
            "--vllm_importance_sampling_mode", "token_mask", "--generation_batch_size", "16",
            "--num_completions_to_print", "2", "--pad_to_multiple_of", "auto", "--shuffle_dataset", "false",
        ]
    )  # fmt: skip
    assert args.vllm_server_base_url == "http://localhost:8001" and args.groups_per_step == 2
    assert (args.importance_sampling, args.importance_sampling_cap, args.num_completions_to_print) == (
        "token_mask",
        3.0,
        2,
    )
    names = {f.name for f in dataclasses.fields(HarnessGRPOConfig) if f.init}
    mine = [
        "use_vllm", "vllm_mode", "vllm_server_base_url", "vllm_server_port", "importance_sampling",
        "importance_sampling_cap", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "generation_batch_size", "groups_per_step", "num_generations",
    ]  # fmt: skip
    again = config(**{name: getattr(args, name) for name in mine if name in names})
    assert all(getattr(again, name) == getattr(args, name) for name in mine)


def test_the_trainer_builds_its_loss_and_engine_from_the_resolved_settings(tmp_path: Any) -> None:
    from examples import submit_task
    from examples.white_box_submit import SubmitTaskSessionFactory
    from harness_grpo.trainer import HarnessAsyncGRPOTrainer

    args = HarnessGRPOConfig(
        output_dir=str(tmp_path),
        report_to=[],
        num_generations=2,
        vllm_importance_sampling_mode="token_mask",
        top_entropy_quantile=0.2,
    )
    trainer = HarnessAsyncGRPOTrainer("tiny", SubmitTaskSessionFactory, args, submit_task.dataset())
    assert trainer.loss_config == LossConfig(
        importance_sampling="token_mask", is_cap=3.0, is_floor=0.0, top_entropy_quantile=0.2
    )
    assert trainer.args.vllm_server_base_url is None  # the embedded engine
