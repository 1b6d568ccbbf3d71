"""codex: ``codex exec`` with a custom Responses-API provider at ``<proxy>/v1`` and no sandbox of its own.

``CODEX_HOME`` is ``home/.codex`` holding only our ``config.toml`` (a ``harness`` model provider with
``wire_api = "responses"``); the key travels in ``HARNESS_API_KEY`` (the provider's ``env_key``). No
retries, no plugin sync from github.com or chatgpt.com, no update checks. codex has no step-limit flag:
the proxy's ``max_model_calls`` bounds the session (its budget reply is plain text, which ends codex's
turn). A system prompt replaces codex's base instructions (``model_instructions_file``) and, as for any small
model, turns off what is not the shell: the goal and image tools and the bundled skills' instructions (its
request falls from about 3.4k to 1.6k tokens of the tiny model; ``exec_command``, ``write_stdin`` and
``request_user_input`` stay). Its last message is ``home/codex-last-message.txt`` (output ``last_message``).
"""

from __future__ import annotations

from pathlib import Path

from harness_grpo.agents.spec import AgentCommand, AgentLaunch, AgentSpec, Install

SMALL_MODEL_OFF = ("goals", "view_image", "image_generation", "skill_search")
"""codex features turned off with a system prompt (with ``[skills.bundled] enabled = false``)."""


def configure(launch: AgentLaunch) -> AgentCommand:
    codex_home = launch.home / ".codex"
    files: dict[Path, str] = {}
    instructions = ""
    small_model_features = ""
    if launch.system_prompt is not None:
        files[codex_home / "instructions.md"] = launch.system_prompt
        instructions = f'model_instructions_file = "{codex_home / "instructions.md"}"\n'
        small_model_features = "".join(f"{feature} = false\n" for feature in SMALL_MODEL_OFF)
        small_model_features += "\n[skills.bundled]\nenabled = false\n"
    files[codex_home / "config.toml"] = (
        instructions + f'model = "{launch.model}"\n'
        'model_provider = "harness"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "\n"
        "[model_providers.harness]\n"
        'name = "harness"\n'
        f'base_url = "{launch.base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "HARNESS_API_KEY"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
        "\n"
        "[features]\n"
        "plugins = false\n"
        "remote_plugin = false\n"
        "in_app_updates = false\n" + small_model_features
    )
    last = launch.home / "codex-last-message.txt"
    argv = [
        launch.binary,
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--ephemeral",
        "--color",
        "never",
        "--json",
        "-C",
        str(launch.workdir),
        "-o",
        str(last),
        launch.task,
    ]
    return AgentCommand(
        argv=argv,
        env={"CODEX_HOME": str(codex_home), "HARNESS_API_KEY": launch.api_key, "RUST_LOG": "warn"},
        files=files,
        outputs={"last_message": last},
    )


SPEC = AgentSpec(
    name="codex",
    binary="codex",
    dialect="openai_responses",
    install=Install("npm", "@openai/codex", "0.169.0"),
    configure=configure,
    max_steps=None,
    # a reply cut at max_output_tokens is a Responses ``incomplete``, on which codex fails its turn and exits 1;
    # its own JSON event starts the line (the model's text is escaped inside other events)
    output_limit_failure=r'^\{"type":"turn\.failed","error":\{"message":"Incomplete response returned, '
    r'reason: max_output_tokens"',
)
