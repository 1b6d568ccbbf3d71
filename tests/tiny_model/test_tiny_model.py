"""The tiny model: deterministic build, chat template, synthetic data, warm start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from harness_grpo.tiny_model import build_tiny_model, tiny_model_path, warm_tiny_model_path
from harness_grpo.tiny_model.build import MARKUP_TOKENS, SPECIAL_TOKENS
from harness_grpo.tiny_model.synthetic import heldout_prompts, synthetic_chats
from harness_grpo.tiny_model.warm_start import (
    WARM_RECIPE,
    evaluate_tool_calls,
    group_loss,
    name_weights,
    tokenize_chat,
    warm_digest,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


@pytest.fixture(scope="module")
def base() -> Path:
    return tiny_model_path()


@pytest.fixture(scope="module")
def tok(base: Path) -> Any:
    return AutoTokenizer.from_pretrained(base)


def test_base_build_is_deterministic(tmp_path: Path) -> None:
    a, b = build_tiny_model(tmp_path / "a"), build_tiny_model(tmp_path / "b")
    for name in ("model.safetensors", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_config_has_32k_positions(base: Path) -> None:
    assert AutoConfig.from_pretrained(base).max_position_embeddings == 32768


def test_special_and_markup_tokens_are_single_ids(tok: Any) -> None:
    for token in SPECIAL_TOKENS + MARKUP_TOKENS:
        assert tok.encode(token, add_special_tokens=False) == [tok.convert_tokens_to_ids(token)], token


def test_template_drops_reasoning_before_last_user_query(tok: Any) -> None:
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "r2"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert "r1" not in text and "<|im_start|>assistant\na1<|im_end|>\n" in text
    assert "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n" in text


def test_template_ends_every_turn_with_im_end_newline(tok: Any) -> None:
    chat = synthetic_chats(1, 5)[0]
    text = tok.apply_chat_template(chat["messages"], tools=chat["tools"], tokenize=False)
    assert text.count("<|im_start|>") == text.count("<|im_end|>\n") == text.count("<|im_end|>")
    assert text.endswith("<|im_end|>\n")


def test_template_folds_consecutive_tool_results_into_one_user_turn(tok: Any) -> None:
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
        {"role": "tool", "content": "X"},
        {"role": "tool", "content": "Y"},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    folded = "<|im_start|>user\n<tool_response>\nX\n</tool_response>\n<tool_response>\nY\n</tool_response><|im_end|>\n"
    assert text.endswith(folded)
    assert text.count("<|im_start|>user") == 2


def test_template_enable_thinking_false_prefix(tok: Any) -> None:
    messages = [{"role": "user", "content": "hi"}]
    plain = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    off = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert plain.endswith("<|im_start|>assistant\n")
    assert off == plain + "<think>\n\n</think>\n\n"


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    """A small JSON-schema check: types, enums, required and additionalProperties."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return False
    if kind == "object":
        props = schema.get("properties", {})
        if not isinstance(value, dict) or any(k not in value for k in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return False
        return all(_valid(v, props[k]) for k, v in value.items() if k in props)
    if kind == "array":
        return isinstance(value, list) and all(_valid(v, schema.get("items", {})) for v in value)
    checks = {"string": str, "number": (int, float), "boolean": bool}
    return kind not in checks or isinstance(value, checks[kind])


def test_synthetic_chats_are_deterministic_and_call_listed_tools_validly() -> None:
    chats = synthetic_chats(300, 7)
    assert json.dumps(chats) == json.dumps(synthetic_chats(300, 7))
    assert json.dumps(chats) != json.dumps(synthetic_chats(300, 8))
    n_calls = 0
    for chat in chats:
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in chat["tools"]}
        assert chat["messages"][-1]["role"] == "assistant" and not chat["messages"][-1].get("tool_calls")
        for message in chat["messages"]:
            for call in message.get("tool_calls") or []:
                name, args = call["function"]["name"], call["function"]["arguments"]
                assert name in schemas and _valid(args, schemas[name]), (name, args)
                n_calls += 1
    assert n_calls > 2 * len(chats)


def test_synthetic_groups_share_system_prompt_and_tools() -> None:
    chats = synthetic_chats(12, 3, group_size=4)
    for i in range(0, 12, 4):
        group = chats[i : i + 4]
        assert all(c["tools"] == group[0]["tools"] for c in group)
        systems = {c["messages"][0]["content"] if c["messages"][0]["role"] == "system" else None for c in group}
        assert len(systems) == 1


def test_heldout_prompts_end_before_a_tool_call_turn() -> None:
    prompts = heldout_prompts(40, 11)
    assert len(prompts) == 40
    assert all(p["messages"][-1]["role"] in ("user", "tool") for p in prompts)
    long = heldout_prompts(2, 12, system_chars=20_000)
    assert all(len(p["messages"][0]["content"]) >= 20_000 for p in long)


def _expected_span(message: dict[str, Any]) -> str:
    calls = [
        json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False)
        for c in message.get("tool_calls") or []
    ]
    calls = [f"<tool_call>\n{c}\n</tool_call>" for c in calls]
    return "\n".join(([message["content"]] if message["content"] else []) + calls) + "<|im_end|>"


def _spans(tok: Any, ids: list[int], mask: list[int]) -> list[str]:
    spans, current = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            current.append(i)
        elif current:
            spans.append(tok.decode(current))
            current = []
    return spans + ([tok.decode(current)] if current else [])


def test_assistant_mask_covers_exactly_the_assistant_spans(tok: Any) -> None:
    for chat in synthetic_chats(20, 2):
        ids, mask = tokenize_chat(tok, chat)
        expected = [_expected_span(m) for m in chat["messages"] if m["role"] == "assistant"]
        assert _spans(tok, ids, mask) == expected


def test_no_think_example_puts_the_cut_turn_after_the_empty_think_prefix(tok: Any) -> None:
    chat = next(c for c in synthetic_chats(20, 4) if len(c["messages"]) >= 6)
    cut = max(i for i, m in enumerate(chat["messages"]) if m["role"] == "assistant" and m.get("tool_calls"))
    ids, mask = tokenize_chat(tok, chat, no_think_at=cut)
    spans = _spans(tok, ids, mask)
    assert spans == [_expected_span(m) for m in chat["messages"][: cut + 1] if m["role"] == "assistant"]
    text = tok.decode(ids)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n" + spans[-1] + "\n")


def test_name_weights_cover_exactly_the_tool_names(tok: Any) -> None:
    chat = synthetic_chats(1, 6)[0]
    ids, mask = tokenize_chat(tok, chat)
    weights = name_weights(tok, ids, mask, 5.0)
    assert all((w > 0) == bool(m) for w, m in zip(weights, mask, strict=True))
    names = [c["function"]["name"] for m in chat["messages"] for c in m.get("tool_calls") or []]
    assert tok.decode([i for i, w in zip(ids, weights, strict=True) if w == 5.0]) == "".join(f'{n}",' for n in names)


def test_group_loss_equals_full_sequence_loss(base: Path, tok: Any) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base)
    chats = synthetic_chats(3, 9, group_size=3)
    rows = [tokenize_chat(tok, c) for c in chats]
    split = rows[0][0].index(tok.convert_tokens_to_ids("<|im_start|>"), 1)
    prefix = rows[0][0][:split]
    with torch.no_grad():
        grouped = group_loss(model, prefix, [(i[split:], m[split:]) for i, m in rows], tok.pad_token_id)
        total, count = 0.0, 0
        for ids, mask in rows:
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
            target = torch.tensor(mask[1:], dtype=torch.bool)
            loss = torch.nn.functional.cross_entropy(logits[target], torch.tensor(ids[1:])[target], reduction="sum")
            total, count = total + loss.item(), count + int(target.sum())
    assert grouped.item() == pytest.approx(total / count, rel=1e-4)


def test_warm_digest_depends_on_recipe() -> None:
    assert warm_digest() == warm_digest(dict(WARM_RECIPE))
    assert warm_digest() != warm_digest(dict(WARM_RECIPE, steps=WARM_RECIPE["steps"] + 1))


def test_evaluate_reports_rates_for_the_base_model(base: Path) -> None:
    report = evaluate_tool_calls(base, heldout_prompts(2, 3, system_chars=0), 1.0, max_new_tokens=8)
    assert report["n"] == 2 and 0.0 <= report["parsable"] <= 1.0
    assert report["mean_new_tokens"] <= 8


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_warm_model_calls_listed_tools_on_heldout_prompts() -> None:
    """Measured at T=0.7 on these 32 prompts: 72% parsable, 44% valid calls (base model: 0%).

    The bounds are well under the measured rates (CPU training differs from run to run); they still
    fail a model that has not learned the format.
    """
    path = warm_tiny_model_path()
    assert (path / "tokenizer.json").read_bytes() == (tiny_model_path() / "tokenizer.json").read_bytes()
    report = evaluate_tool_calls(path, heldout_prompts(32, 7), 0.7, seed=2)
    print({k: v for k, v in report.items() if k != "samples"})
    assert report["parsable"] >= 0.3, report
    assert report["valid_call"] > 0.0, report
