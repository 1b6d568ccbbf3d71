"""``python -m harness_grpo.engine`` as a subprocess: serves, honours --max-model-len, exits on SIGTERM."""

from __future__ import annotations

import pytest

from tests.engine.conftest import Http


@pytest.mark.timeout(180)
def test_engine_process_serves_and_limits_context(start_engine_process):
    process = start_engine_process("--model", "tiny", "--max-model-len", "64")
    http = Http(process.url)
    status, models = http.get("/v1/models")
    assert status == 200 and models["data"][0]["max_model_len"] == 64
    assert models["data"][0]["id"] == "harness-grpo/tiny-qwen3"
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    status, response = http.post("/v1/chat/completions", body)
    assert status == 200 and len(response["choices"][0]["token_ids"]) == 4
    status, error = http.post("/v1/chat/completions", {**body, "max_tokens": 60})
    assert status == 400 and error["error"]["param"] == "max_tokens"
    assert process.stop() == 0
