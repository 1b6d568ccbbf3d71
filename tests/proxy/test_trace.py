"""TrainingTrace contract: every rule, the allowed cases, and compatibility with OpenEnv's own models."""

from __future__ import annotations

import copy
import math
import random
import re
from typing import Any

import orjson
import pytest
from openenv.core.harness.training import TrainingTrace as OpenEnvTrainingTrace
from pydantic import ValidationError

from proxy.trace import CaptureContractError, TrainingTrace, TrainingTurn
from tests.support.counting import python_steps


def _turn(**changes: Any) -> dict[str, Any]:
    turn = {
        "node_id": "n1",
        "prompt_token_ids": [10, 11],
        "completion_token_ids": [12, 13, 14],
        "per_token_logps": [-0.5, -1.0, -0.25],
        "loss_mask": [0, 0, 1, 0, 1],
        "request": {"messages": [{"role": "user", "content": "hi"}], "tools": []},
        "response": {"choices": [{"message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}]},
        "metadata": {"index": 0},
    }
    turn.update(changes)
    return turn


def _trace(*turns: dict[str, Any], **changes: Any) -> dict[str, Any]:
    head = _turn(node_id="n0", prompt_token_ids=[1], completion_token_ids=[], per_token_logps=[], loss_mask=[0])
    return {"schema_version": 1, "turns": [head, *turns], **changes}


def _without(key: str) -> dict[str, Any]:
    turn = _turn()
    del turn[key]
    return turn


REJECTED = [
    pytest.param(
        _trace(_turn(prompt_token_ids=[10, -1])), "invalid_token_id", "turns[1].prompt_token_ids[1]", id="neg"
    ),
    pytest.param(_trace(_turn(prompt_token_ids=[True, 11])), "invalid_token_id", "prompt_token_ids[0]", id="bool"),
    pytest.param(_trace(_turn(prompt_token_ids=[10, 11.0])), "invalid_token_id", "prompt_token_ids[1]", id="float"),
    pytest.param(_trace(_turn(prompt_token_ids=[10, "11"])), "invalid_token_id", "prompt_token_ids[1]", id="str"),
    pytest.param(
        _trace(_turn(completion_token_ids=[12, -13, 14])), "invalid_token_id", "completion_token_ids[1]", id="cneg"
    ),
    pytest.param(
        _trace(_turn(completion_token_ids=[12, 13, False])), "invalid_token_id", "completion_token_ids[2]", id="cbool"
    ),
    pytest.param(
        _trace(_turn(prompt_token_ids=[], loss_mask=[0, 1, 1])), "no_prompt_ids", "turns[1].prompt_token_ids", id="np"
    ),
    pytest.param(
        _trace(_turn(per_token_logps=[-0.5, math.nan, -0.25])), "invalid_logprob", "per_token_logps[1]", id="nan"
    ),
    pytest.param(
        _trace(_turn(per_token_logps=[-0.5, -1.0, -math.inf])), "invalid_logprob", "per_token_logps[2]", id="-inf"
    ),
    pytest.param(_trace(_turn(per_token_logps=[-0.5, True, -0.25])), "invalid_logprob", "per_token_logps[1]", id="lb"),
    pytest.param(_trace(_turn(per_token_logps=["x", -1.0, -0.25])), "invalid_logprob", "per_token_logps[0]", id="ls"),
    pytest.param(
        _trace(_turn(per_token_logps=[-0.5, 0.5, -0.25])), "positive_logprob", "per_token_logps[1]", id="positive"
    ),
    pytest.param(_trace(_turn(per_token_logps=[-0.5, -1.0])), "logprob_misalign", "per_token_logps", id="short"),
    pytest.param(_trace(_turn(per_token_logps=[])), "logprob_misalign", "turns[1].per_token_logps", id="empty_lp"),
    pytest.param(_trace(_turn(loss_mask=[0, 0, 1, 0])), "length_mismatch", "turns[1].loss_mask", id="mask_len"),
    pytest.param(_trace(_turn(loss_mask=[0, 0, 1, 2, 1])), "invalid_loss_mask", "loss_mask[3]", id="mask2"),
    pytest.param(_trace(_turn(loss_mask=[0, 0, 1, -1, 1])), "invalid_loss_mask", "loss_mask[3]", id="mask-1"),
    pytest.param(_trace(_turn(loss_mask=[0, 0, True, 0, 1])), "invalid_loss_mask", "loss_mask[2]", id="mask_bool"),
    pytest.param(_trace(_turn(loss_mask=[0, 0, 1.0, 0, 1])), "invalid_loss_mask", "loss_mask[2]", id="mask_float"),
    pytest.param(_trace(_turn(loss_mask=[0, 1, 1, 0, 1])), "trainable_prompt", "turns[1].loss_mask[1]", id="prompt1"),
    pytest.param(_trace(_without("loss_mask")), "missing_field", "turns[1].loss_mask", id="no_mask"),
    pytest.param(_trace(_without("per_token_logps")), "missing_field", "turns[1].per_token_logps", id="no_lps"),
    pytest.param(_trace(_turn(reward=1.0)), "extra_field", "turns[1].reward", id="turn_extra"),
    pytest.param(_trace(extra=1), "extra_field", "extra", id="trace_extra"),
    pytest.param(_trace(schema_version=2), "schema_version", "schema_version", id="v2"),
    pytest.param(_trace(_turn(node_id="")), "invalid_node_id", "turns[1].node_id", id="empty_id"),
    pytest.param(_trace(_turn(node_id=7)), "invalid_node_id", "turns[1].node_id", id="int_id"),
    pytest.param(_trace(_turn(node_id="n0")), "duplicate_node_id", "turns[1].node_id", id="dup"),
    pytest.param(_trace(_turn(metadata=[])), "invalid_field", "turns[1].metadata", id="metadata"),
    pytest.param({"schema_version": 1}, "missing_field", "turns", id="no_turns"),
    pytest.param({"turns": [5]}, "invalid_field", "turns[0]", id="turn_not_a_dict"),
]


@pytest.mark.parametrize(("payload", "code", "where"), REJECTED)
def test_rule_rejected_with_code_and_place(payload: dict[str, Any], code: str, where: str) -> None:
    with pytest.raises(ValueError, match=code) as caught:
        TrainingTrace.model_validate(payload)
    assert where in str(caught.value)
    contract = caught.value.errors()[0]["ctx"]["error"]
    assert isinstance(contract, CaptureContractError)
    assert contract.code == code


@pytest.mark.parametrize(("payload", "code", "where"), REJECTED)
def test_rule_rejected_from_json(payload: dict[str, Any], code: str, where: str) -> None:
    data = orjson.dumps(payload)  # NaN and infinities become null, still an invalid_logprob
    for parse in (TrainingTrace.model_validate_json, TrainingTrace.from_json):
        with pytest.raises(ValueError, match=code):
            parse(data)


# OpenEnv's pydantic type errors, by (error type, field), named as the rule they break. Its own rule
# checks (`validate_training_turn`) already name theirs: `[FATAL] <code>: ...`.
OPENENV_TYPE_ERRORS = {
    ("int_type", "prompt_token_ids"): "invalid_token_id",
    ("int_type", "completion_token_ids"): "invalid_token_id",
    ("float_type", "per_token_logps"): "invalid_logprob",
    ("int_type", "loss_mask"): "invalid_loss_mask",
    ("string_type", "node_id"): "invalid_node_id",
    ("string_too_short", "node_id"): "invalid_node_id",
    ("literal_error", "schema_version"): "schema_version",
    ("dict_type", "metadata"): "invalid_field",
    ("model_type", "turns"): "invalid_field",
}


def _openenv_reasons(error: ValidationError) -> list[tuple[str, str]]:
    """``(rule code, where)`` for each of OpenEnv's errors; an error this table cannot name stays unnamed."""
    reasons = []
    for err in error.errors():
        loc = err["loc"]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
        field = next((part for part in reversed(loc) if isinstance(part, str)), "")
        if err["type"] == "value_error":
            message = str(err["ctx"]["error"])
            codes = re.findall(r"\[FATAL\] (\w+):", message)
            if "duplicate node_ids" in message:
                codes.append("duplicate_node_id")
            reasons += [(code, where) for code in codes] or [(f"unnamed value error {message!r}", where)]
        elif err["type"] in ("missing", "extra_forbidden"):
            reasons.append(("missing_field" if err["type"] == "missing" else "extra_field", where))
        else:
            reasons.append((OPENENV_TYPE_ERRORS.get((err["type"], field), f"unnamed {err['type']}"), where))
    return reasons


@pytest.mark.parametrize(("payload", "code", "where"), REJECTED)
def test_openenv_rejects_what_we_reject_for_the_same_reason(payload: dict[str, Any], code: str, where: str) -> None:
    with pytest.raises(ValidationError) as ours:
        TrainingTrace.model_validate(copy.deepcopy(payload))
    our_violations = ours.value.errors()[0]["ctx"]["error"].violations
    with pytest.raises(ValidationError) as theirs:
        OpenEnvTrainingTrace.model_validate(copy.deepcopy(payload))
    reasons = _openenv_reasons(theirs.value)
    assert sorted(c for c, _ in reasons) == sorted(v.code for v in our_violations), (reasons, our_violations)
    # OpenEnv places its rule checks at the turn, its type errors at the element: ours is as precise or more.
    places = {v.code: v.where for v in our_violations}
    for reason_code, place in reasons:
        assert places[reason_code].startswith(place), (reason_code, place, places[reason_code])


def test_single_turn_reports_every_broken_rule() -> None:
    with pytest.raises(ValueError) as caught:
        TrainingTurn.model_validate(_turn(prompt_token_ids=[], completion_token_ids=[-1], loss_mask=[0]))
    message = str(caught.value)
    for code in ("invalid_token_id at completion_token_ids[0]", "no_prompt_ids", "logprob_misalign"):
        assert code in message


ALLOWED = [
    pytest.param(_turn(completion_token_ids=[], per_token_logps=[], loss_mask=[0, 0]), id="empty_completion"),
    pytest.param(_turn(loss_mask=[0] * 5), id="all_zero_mask"),
    pytest.param(_turn(loss_mask=[0, 0, 1, 1, 1]), id="full_mask"),
    pytest.param(_turn(per_token_logps=[0.0, -0.0, -1e300]), id="certain_tokens"),
    pytest.param(_turn(request={}, response={}, metadata={}), id="empty_dicts"),
]


@pytest.mark.parametrize("turn", ALLOWED)
def test_allowed(turn: dict[str, Any]) -> None:
    trace = TrainingTrace.model_validate({"turns": [turn]})
    assert TrainingTrace.model_validate_json(trace.model_dump_json()) == trace
    OpenEnvTrainingTrace.model_validate({"turns": [turn]})


def test_integer_logprobs_coerced_to_float() -> None:
    turn = TrainingTurn.model_validate(_turn(per_token_logps=[0, -1, -2]))
    assert turn.per_token_logps == [0.0, -1.0, -2.0]
    assert all(type(x) is float for x in turn.per_token_logps)


def test_empty_trace_and_defaults() -> None:
    trace = TrainingTrace.model_validate_json('{"turns": []}')
    assert trace.model_dump_json() == '{"schema_version":1,"turns":[]}'
    turn = TrainingTurn(node_id="a", prompt_token_ids=[1], completion_token_ids=[], per_token_logps=[], loss_mask=[0])
    assert (turn.request, turn.response, turn.metadata) == ({}, {}, {})


def test_json_round_trip_orjson_matches_pydantic() -> None:
    trace = TrainingTrace.model_validate(_trace(_turn()))
    assert trace.to_json() == trace.model_dump_json().encode()
    assert TrainingTrace.from_json(trace.to_json()) == trace
    assert TrainingTrace.model_validate_json(trace.model_dump_json()) == trace


def test_round_trip_through_openenv() -> None:
    ours = TrainingTrace.model_validate(
        _trace(_turn(), _turn(node_id="n2", loss_mask=[0] * 5, per_token_logps=[0, -1, -2]))
    )
    theirs = OpenEnvTrainingTrace.model_validate_json(ours.model_dump_json())
    back = TrainingTrace.model_validate_json(theirs.model_dump_json())
    assert back == ours
    assert theirs.model_dump_json() == ours.model_dump_json()
    assert TrainingTrace.from_json(theirs.model_dump_json()) == ours


def _big_trace(n_turns: int, n_prompt: int, n_completion: int) -> dict[str, Any]:
    rng = random.Random(0)
    turns = []
    for i in range(n_turns):
        prompt = [rng.randrange(150_000) for _ in range(n_prompt)]
        completion = [rng.randrange(150_000) for _ in range(n_completion)]
        turns.append(
            _turn(
                node_id=f"n{i}",
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                per_token_logps=[-rng.random() for _ in completion],
                loss_mask=[0] * n_prompt + [1] * n_completion,
            )
        )
    return {"turns": turns}


PARSERS = {
    "model_validate": lambda payload: TrainingTrace.model_validate(payload),
    "model_validate_json": lambda payload: TrainingTrace.model_validate_json(orjson.dumps(payload)),
    "from_json": lambda payload: TrainingTrace.from_json(orjson.dumps(payload)),
}


@pytest.mark.parametrize("parse", list(PARSERS))
@pytest.mark.parametrize(("n_turns", "n_prompt", "n_completion"), [(1, 100_000, 1_000), (50, 2_000, 200)])
def test_validation_is_bulk(parse: str, n_turns: int, n_prompt: int, n_completion: int) -> None:
    """The Python work of validating a trace depends on its turns, not on its tokens (no per-token Python
    loop); the timings are in ``bench/trace_export.py``."""
    small, large = _big_trace(n_turns, 3, 2), _big_trace(n_turns, n_prompt, n_completion)
    small_trace, small_steps = python_steps(lambda: PARSERS[parse](small))
    large_trace, large_steps = python_steps(lambda: PARSERS[parse](large))
    assert small_steps >= n_turns  # the contract validator runs in Python once per turn: the count sees it
    assert large_steps == small_steps
    assert len(large_trace.turns[0].prompt_token_ids) == n_prompt and len(small_trace.turns) == n_turns
