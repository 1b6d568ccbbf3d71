"""The synchronous proxy chat call that rollout_func's client and the white-box model step share."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from harness_grpo.proxy_chat import ModelCallError, post_chat_completion
from tests.proxy.proxy_stack import Stack, run_stack


def test_a_call_lands_in_its_session_and_failures_are_model_call_errors(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        session = await stack.create_session()
        base = f"{stack.url}/v1"
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

        reply = await asyncio.to_thread(post_chat_completion, base, session.api_key, chat, time.monotonic() + 30)
        assert reply["choices"][0]["message"]["role"] == "assistant"
        assert len((await stack.trace(session.session_id))["turns"]) == 1

        with pytest.raises(ModelCallError, match="HTTP 401"):
            await asyncio.to_thread(post_chat_completion, base, "not-a-key", chat, None)
        with pytest.raises(ModelCallError, match="HTTP 400"):
            await asyncio.to_thread(post_chat_completion, base, session.api_key, {"model": "m"}, None)
        with pytest.raises(TimeoutError, match="time is up"):
            await asyncio.to_thread(post_chat_completion, base, session.api_key, chat, time.monotonic() - 1)
        with pytest.raises(ModelCallError, match="model call failed"):
            await asyncio.to_thread(post_chat_completion, "http://127.0.0.1:9/v1", session.api_key, chat, None)
        assert len((await stack.trace(session.session_id))["turns"]) == 1  # no failed call was recorded

    run_stack(body, tmp_path)
