"""Reading an engine reply whose ids start with known ids: the same document as parsing it whole, or a full parse."""

from __future__ import annotations

import random
from array import array
from typing import Any

import orjson
import pytest

from proxy.known_prompt import KnownPrompt, extend, loads_reply, open_json

KNOWN = [151644, 8948, 198, 2610, 525]


def _reply(prompt: Any, **extra: Any) -> dict[str, Any]:
    """A chat completion in vLLM's key order: the choices come before the prompt's ids."""
    choice = {"index": 0, "message": {"role": "assistant", "content": "ls ]"}, "token_ids": [7, 8], **extra}
    return {"id": "chatcmpl-1", "choices": [choice], "prompt_logprobs": None, "prompt_token_ids": prompt}


@pytest.mark.parametrize("rest", [[], [3], [0, 12, 151645]])
def test_ids_past_the_known_ones_are_parsed_alone_and_the_document_is_the_same(rest: list[int]) -> None:
    data = orjson.dumps(_reply(KNOWN + rest))
    parsed, json_ = loads_reply(data, "prompt_token_ids", KnownPrompt(KNOWN, open_json(KNOWN)))
    assert parsed == orjson.loads(data)
    assert json_ == orjson.dumps(KNOWN + rest)[:-1]


def test_packed_known_ids_give_packed_ids() -> None:
    data = orjson.dumps({"count": 7, "tokens": [*KNOWN, 1, 2], "token_strs": None})
    parsed, json_ = loads_reply(data, "tokens", KnownPrompt(array("q", KNOWN), open_json(KNOWN)))
    assert parsed["tokens"] == array("q", [*KNOWN, 1, 2])
    assert json_ == orjson.dumps([*KNOWN, 1, 2])[:-1]


@pytest.mark.parametrize(
    "data",
    [
        orjson.dumps(_reply([151644, 8948, 198, 2610, 5250])),  # a longer last id: not the known ids
        orjson.dumps(_reply(KNOWN[:-1])),  # shorter than the known ids
        orjson.dumps(_reply([9, *KNOWN])),
        b'{"prompt_token_ids": [151644,8948,198,2610,525,1]}',  # spelt otherwise
        orjson.dumps({"choices": [{"prompt_token_ids": [*KNOWN, 1]}]}),  # only nested (SGLang's per-choice copy)
        orjson.dumps({"choices": [{"prompt_token_ids": [*KNOWN, 1]}], "prompt_token_ids": [*KNOWN, 2]}),
        b'{"prompt_token_ids":[151644,8948,198,2610,525,1],"prompt_token_ids":[3]}',  # repeated: the last one counts
        b'{"prompt_token_ids":[151644,8948,198,2610,525,"]",4]}',  # not plain ids
        b'{"prompt_token_ids":[151644,8948,198,2610,525,[1]]}',
        b'[{"prompt_token_ids":[151644,8948,198,2610,525]}]',  # not an object
        b'{"id":"x"}',
    ],
)
def test_anything_else_is_parsed_whole(data: bytes) -> None:
    assert loads_reply(data, "prompt_token_ids", KnownPrompt(KNOWN, open_json(KNOWN))) == (orjson.loads(data), None)


def test_packed_ids_that_do_not_fit_are_parsed_whole() -> None:
    data = b'{"tokens":[151644,8948,198,2610,525,18446744073709551615]}'
    parsed, json_ = loads_reply(data, "tokens", KnownPrompt(array("q", KNOWN), open_json(KNOWN)))
    assert parsed == {"tokens": [*KNOWN, 18446744073709551615]} and json_ is None


def test_a_malformed_document_is_a_json_error_either_way() -> None:
    for data in (b'{"prompt_token_ids":[151644,8948,198,2610,525,1]', b'{"prompt_token_ids":[151644,8948,198,2610,525'):
        with pytest.raises(orjson.JSONDecodeError):
            loads_reply(data, "prompt_token_ids", KnownPrompt(KNOWN, open_json(KNOWN)))


def test_random_replies_read_with_a_known_start_equal_a_whole_parse() -> None:
    rng = random.Random(0)
    for _ in range(300):
        prompt = [rng.randrange(200_000) for _ in range(rng.randrange(1, 60))]
        known = prompt[: rng.randrange(1, len(prompt) + 1)]
        if rng.random() < 0.3:  # a wrong guess
            known = [*known[:-1], known[-1] + 1]
        data = orjson.dumps(_reply(prompt))
        parsed, json_ = loads_reply(data, "prompt_token_ids", KnownPrompt(known, open_json(known)))
        assert parsed == orjson.loads(data)
        assert (json_ is not None) == (prompt[: len(known)] == known)


def test_the_open_json_of_a_turn_extends_its_prompts_with_its_sampled_ids() -> None:
    assert extend(open_json(KNOWN), [4, 5]) == orjson.dumps([*KNOWN, 4, 5])[:-1]
    assert extend(open_json(KNOWN), []) == open_json(KNOWN)
