"""opencode: ``opencode run`` with a custom OpenAI-compatible provider at ``<proxy>/v1``; chat completions.

The provider is ``@ai-sdk/openai-compatible`` in ``opencode.json`` in the working tree (REFERENCE §4.4).
``small_model`` is the same model, so opencode's title call goes through the proxy too (an auxiliary,
toolless call). ``steps`` bounds the build agent's loop; every permission is allowed (nobody is there to
answer a prompt). models.dev, autoupdate, sharing and LSP downloads are off. With a system prompt, the
build agent's prompt is replaced and it keeps only its ``bash`` tool, opencode's own settings for small
models.
"""

from __future__ import annotations

import json

from harness_grpo.agents.spec import AgentCommand, AgentLaunch, AgentSpec, Install


def configure(launch: AgentLaunch) -> AgentCommand:
    model = f"harness/{launch.model}"
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "harness": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "harness",
                "options": {"baseURL": f"{launch.base_url}/v1", "apiKey": launch.api_key},
                "models": {launch.model: {"name": launch.model, "tool_call": True}},
            }
        },
        "model": model,
        "small_model": model,
        "autoupdate": False,
        "share": "disabled",
        "permission": {"*": "allow"},
        "agent": {"build": {"steps": launch.max_steps}},
    }
    if launch.system_prompt is not None:
        config["agent"]["build"]["prompt"] = launch.system_prompt
        config["permission"] = {"*": "deny", "bash": "allow"}
    return AgentCommand(
        argv=[launch.binary, "run", "--print-logs", "--model", model, launch.task],
        env={
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        },
        files={launch.workdir / "opencode.json": json.dumps(config, indent=2)},
    )


SPEC = AgentSpec(
    name="opencode",
    binary="opencode",
    dialect="openai_chat",
    install=Install("npm", "opencode-ai", "1.18.33"),
    configure=configure,
    max_steps=6,
)
