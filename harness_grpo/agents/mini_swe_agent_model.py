"""mini-swe-agent's model class for the capture proxy: chat completions over ``requests``, without LiteLLM.

``harness_grpo.agents.mini_swe_agent`` writes this file into the agent's home and names its class with
``model.model_class``, so it runs in mini's own process (in the sandbox), never in the trainer. It is
mini's own OpenRouter model (the same messages, bash tool, tool-call parsing, observation format and
retries as its default LiteLLM model), sending to ``$OPENAI_API_BASE/chat/completions`` with
``$OPENAI_API_KEY`` and no OpenRouter fields. Why not LiteLLM: importing it costs about 10 s of CPU per
run (litellm 1.110), more than all the rest of a short trial. An answer of 400, 401, 403, 404, 413 or 422
ends the run at once (LiteLLM's model aborts on bad parameters, authentication, permission, not-found and
context errors alike); anything else is retried as mini retries.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

import requests
from minisweagent.models.openrouter_model import OpenRouterAPIError, OpenRouterModel
from minisweagent.models.utils.actions_toolcall import BASH_TOOL

FINAL_STATUSES = frozenset({400, 401, 403, 404, 413, 422})
TIMEOUT_S = 600.0  # LiteLLM's default request timeout; the trainer bounds the whole rollout anyway


class ProxyRefusedError(OpenRouterAPIError):
    """The proxy answered with a status no retry can change."""


class ProxyChatModel(OpenRouterModel):
    """mini's OpenRouter model pointed at ``$OPENAI_API_BASE`` (see the module docstring)."""

    abort_exceptions: ClassVar[list[type[Exception]]] = [ProxyRefusedError, KeyboardInterrupt]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._api_url = os.environ["OPENAI_API_BASE"].rstrip("/") + "/chat/completions"
        self._api_key = os.environ["OPENAI_API_KEY"]

    def _query(self, messages: list[dict[str, str]], **kwargs: Any) -> dict[str, Any]:
        payload = {
            "model": self.config.model_name,
            "messages": messages,
            "tools": [BASH_TOOL],
            **(self.config.model_kwargs | kwargs),
        }
        headers = {"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json"}
        try:
            response = requests.post(self._api_url, headers=headers, data=json.dumps(payload), timeout=TIMEOUT_S)
        except requests.exceptions.RequestException as error:
            raise OpenRouterAPIError(f"Request failed: {error}") from error
        if response.status_code in FINAL_STATUSES:
            raise ProxyRefusedError(f"HTTP {response.status_code}: {response.text}")
        if response.status_code >= 400:
            raise OpenRouterAPIError(f"HTTP {response.status_code}: {response.text}")
        return response.json()
