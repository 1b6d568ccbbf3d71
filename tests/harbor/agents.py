"""Harbor agents for the Harbor session tests, loaded by import path as any third-party Harbor agent is.

``ExitsNonZero`` solves the task and then fails as an installed agent whose CLI exited non-zero does, so its
trial has a reward that Harbor marks invalid. ``AsksTheModelOnce`` takes its model connection from Harbor's
``AgentConfig`` (``base_url``, the key under ``model_api_key_name``) and makes one chat completion call with
it from inside the environment.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from harbor.agents.agent_auth_resolution import ModelConnectionSpec
from harbor.agents.base import BaseAgent
from harbor.agents.capabilities import AgentCapabilities
from harbor.agents.installed.base import NonZeroAgentExitCodeError
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from harbor.models.model_api_format import ModelApiFormat

CHAT_ONCE = """\
import json, os, sys, urllib.request
url, key, model = sys.argv[1:4]
body = json.dumps({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(url + "/chat/completions", data=body, headers={
    "Authorization": "Bearer " + key, "Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=120) as response:
    print(json.load(response)["choices"][0]["message"].get("content"))
"""


class ExitsNonZero(BaseAgent):
    @staticmethod
    def name() -> str:
        return "exits-non-zero"

    def version(self) -> str | None:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await environment.exec("echo 42 > /app/answer.txt")
        raise NonZeroAgentExitCodeError("the agent exited with status 3")


class AsksTheModelOnce(BaseAgent):
    MODEL_CONNECTION = ModelConnectionSpec(supported_api_formats=[ModelApiFormat.OPENAI_CHAT_COMPLETIONS])
    capabilities = AgentCapabilities(base_url=True)

    @staticmethod
    def name() -> str:
        return "asks-the-model-once"

    def version(self) -> str | None:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        connection = self.model_connection
        argv: list[Any] = [
            "python3",
            "-c",
            CHAT_ONCE,
            connection.execution_base_url,
            connection.api_key,
            self.model_name,
        ]
        result = await environment.exec(shlex.join(str(part) for part in argv))
        context.metadata = {"connection": json.dumps([connection.execution_base_url, self.model_name])}
        if result.return_code != 0:
            raise NonZeroAgentExitCodeError(f"the model call failed: {result.stderr}")
