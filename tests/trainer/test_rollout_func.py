"""``rollout_func`` (TRL's escape hatch) through the real proxy and embedded engine on the tiny model (untrained:
its replies vary, so the function's own reward has spread).

The function owns its loop: two chat turns through ``trainer.rollout_clients[0]`` (the capture proxy
under the rollout's own key), a reward it computes itself, TRL's ``prompt_ids``/``completion_ids`` read
from the proxy's answer, and an extra field. Checked: real optimizer steps on what was captured, its
rewards are the ones trained on, extra fields reach ``rollout_reward_fn``, and the contract's breaches
(ids the proxy did not capture, no reward, a wrong output shape, a factory beside it) are clear errors.
"""

from __future__ import annotations

import collections
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from examples.white_box_submit import SubmitToolLoop
from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.outcomes import HarnessRolloutOutcome
from harness_grpo.rollout_func import RolloutFuncTrainer
from harness_grpo.rollouts import ProducerError, run_rollout
from harness_grpo.trainer import HarnessAsyncGRPOTrainer

MODEL = "tiny"
DATASET = [{"prompt": "Say hello."}, {"prompt": "Count to three."}]


def _args(tmp_path: Path, **kw: Any) -> HarnessGRPOConfig:
    settings = dict(
        output_dir=str(tmp_path),
        seed=0,
        max_steps=2,
        learning_rate=1e-3,
        num_generations=2,
        max_completion_length=12,
        rollout_timeout_s=120,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    return HarnessGRPOConfig(**{**settings, **kw})


class TwoTurnRollout:
    """A TRL-style ``rollout_func``: two turns through the proxy, its own reward, TRL's keys and an extra field."""

    def __init__(self, *, ids: str = "captured", reward: bool = True) -> None:
        self.ids = ids
        self.reward = reward
        self.rewards: list[float] = []
        self.finished: collections.Counter[str] = collections.Counter()
        self.views: list[RolloutFuncTrainer] = []
        self.lock = threading.Lock()

    def __call__(self, prompts: list[Any], trainer: RolloutFuncTrainer) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "reply_chars": []}
        for prompt, client in zip(prompts, trainer.rollout_clients, strict=True):
            messages = [{"role": "user", "content": prompt}]
            first = client.chat(messages, return_token_ids=True)["choices"][0]["message"]
            messages += [
                {"role": "assistant", "content": first.get("content") or ""},
                {"role": "user", "content": "More."},
            ]
            reply = client.chat(messages, return_token_ids=True, logprobs=True)
            choice = reply["choices"][0]
            text = choice["message"].get("content") or ""
            if self.ids == "captured":
                out["prompt_ids"].append(reply["prompt_token_ids"])
                out["completion_ids"].append(choice["token_ids"])
            else:  # re-tokenized text: not what the engine sampled
                out["prompt_ids"].append(trainer.processing_class.encode(prompt))
                out["completion_ids"].append(trainer.processing_class.encode(text))
            out["logprobs"].append([entry["logprob"] for entry in choice["logprobs"]["content"]])
            out["reply_chars"].append(len(text))
        with self.lock:
            # A reward that always has spread across a group (a sampled one can tie, and then nothing trains):
            # 0 and 1 by turns among the rollouts of one prompt, in the order they finish.
            rewards = []
            for prompt in prompts:
                rewards.append(float(self.finished[prompt] % 2))
                self.finished[prompt] += 1
            self.rewards += rewards
            self.views.append(trainer)
        if self.reward:
            out["env_reward"] = rewards
        return out


@pytest.mark.timeout(600)
def test_rollout_func_trains_on_what_the_proxy_captured(tmp_path: Path) -> None:
    rollout = TwoTurnRollout()
    args = _args(tmp_path, save_rollouts=True)
    trainer = HarnessAsyncGRPOTrainer(MODEL, args=args, train_dataset=DATASET, rollout_func=rollout)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    trained = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(trained) == 4 and all(r["reward"] == r["env_reward"] and r["reward"] in rollout.rewards for r in trained)
    for record in trained:  # every rollout's two captured turns are what trained
        assert [len(t["completion_token_ids"]) > 0 for t in record["trace"]["turns"]] == [True, True]
    assert len(trainer.state.log_history) == 2 and trainer.state.policy_version == 2
    for entry in trainer.state.log_history:
        assert entry["rollout/errors"] == 0 and entry["rollout/unscorable_frac"] == 0
        assert entry["rollout/turns_mean"] == 2  # both turns of every rollout were captured
        assert entry["trained_tokens"] > 0 and "skipped_no_signal" not in entry
        assert 0.0 <= entry["reward"] <= 1.0
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    view = rollout.views[0]
    assert view.processing_class is trainer.tokenizer and view.num_generations == 2 and view.args is trainer.args
    assert len(view.rollout_clients) == 1 and view.rollout_clients[0].base_url.endswith("/v1")
    assert len({v.rollout_clients[0].api_key for v in rollout.views}) == len(rollout.views)  # a key per rollout


@pytest.mark.timeout(600)
def test_extra_fields_reach_the_rollout_reward_fn(tmp_path: Path) -> None:
    seen: list[HarnessRolloutOutcome] = []

    def reward(outcome: HarnessRolloutOutcome) -> float:
        seen.append(outcome)
        return float(outcome.extra_fields["reply_chars"] % 3)

    trainer = HarnessAsyncGRPOTrainer(
        MODEL,
        args=_args(tmp_path, max_steps=1),
        train_dataset=DATASET,
        rollout_reward_fn=reward,
        rollout_func=TwoTurnRollout(reward=False),  # no env_reward: the reward function scores
    )
    trainer.train()
    assert len(seen) == 2
    for outcome in seen:
        assert set(outcome.extra_fields) == {"reply_chars"}  # TRL's trained keys are not extra fields
        assert outcome.env_reward is None and outcome.error is None
        assert len(outcome.training_trace.turns) == 2
    (entry,) = trainer.state.log_history
    assert entry["rollout/unscorable_frac"] == 0


@pytest.mark.timeout(600)
def test_ids_the_proxy_did_not_capture_stop_training(tmp_path: Path) -> None:
    trainer = HarnessAsyncGRPOTrainer(
        MODEL, args=_args(tmp_path, max_steps=1), train_dataset=DATASET, rollout_func=TwoTurnRollout(ids="retokenized")
    )
    with pytest.raises(ProducerError, match="proxy did not capture for this rollout"):
        trainer.train()


@pytest.mark.timeout(600)
def test_outputs_that_break_the_contract(tmp_path: Path) -> None:
    """One rollout at a time through the trainer's services: missing reward, wrong shape, no model call."""

    def no_call(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {"env_reward": [1.0]}

    def two_rewards(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        trainer.rollout_clients[0].chat([{"role": "user", "content": "hi"}])
        return {"env_reward": [1.0, 0.0]}

    def skipped(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {"env_reward": None}  # no model call and no reward: unscorable, not a breach

    def openai_sdk(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        import openai

        (client,) = trainer.rollout_clients
        sdk = openai.OpenAI(base_url=client.base_url, api_key=client.api_key)
        reply = sdk.chat.completions.create(model=client.model, messages=[{"role": "user", "content": prompts[0]}])
        return {"env_reward": 0.5, "text": reply.choices[0].message.content}

    trainer = HarnessAsyncGRPOTrainer(MODEL, args=_args(tmp_path), train_dataset=DATASET, rollout_func=no_call)
    trainer._start_services()
    try:
        factory, row = trainer.session_factory, DATASET[0]
        with pytest.raises(ValueError, match="no model call through the proxy"):
            run_rollout(factory, row, seed=0, timeout_s=60)
        factory.rollout_func = two_rewards
        with pytest.raises(ValueError, match="'env_reward' with 2 entries for 1 prompt"):
            run_rollout(factory, row, seed=0, timeout_s=60)
        factory.rollout_func = skipped
        outcome = run_rollout(factory, row, seed=0, timeout_s=60)
        assert outcome.error is None and outcome.env_reward is None and outcome.training_trace.turns == []
        factory.rollout_func = TwoTurnRollout(reward=False)
        outcome = run_rollout(factory, row, seed=0, timeout_s=60)
        assert "rollout_func returned no 'env_reward'" in outcome.error and outcome.env_reward is None
        factory.rollout_func = openai_sdk
        outcome = run_rollout(factory, row, seed=0, timeout_s=60)
        assert outcome.error is None and outcome.env_reward == 0.5 and len(outcome.training_trace.turns) == 1
        assert outcome.extra_fields["text"] == outcome.completion[-1]["content"]
    finally:
        trainer._stop_services()


def test_rollout_func_comes_alone_and_needs_prompts(tmp_path: Path) -> None:
    rollout = TwoTurnRollout()
    with pytest.raises(ValueError, match="harness_session_factory can't come with it"):
        HarnessAsyncGRPOTrainer(MODEL, lambda **kw: None, _args(tmp_path), DATASET, rollout_func=rollout)
    with pytest.raises(ValueError, match="harness_adapter can't come with it"):
        HarnessAsyncGRPOTrainer(
            MODEL, args=_args(tmp_path), train_dataset=DATASET, harness_adapter=SubmitToolLoop(), rollout_func=rollout
        )
    with pytest.raises(ValueError, match="'prompt' column"):
        HarnessAsyncGRPOTrainer(MODEL, args=_args(tmp_path), train_dataset=[{"task": "x"}], rollout_func=rollout)
    with pytest.raises(TypeError, match="callable"):
        HarnessAsyncGRPOTrainer(MODEL, args=_args(tmp_path), train_dataset=DATASET, rollout_func="f")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"or rollout_func= \(your function does\)"):
        HarnessAsyncGRPOTrainer(MODEL, args=_args(tmp_path), train_dataset=DATASET)
