"""claude-code: ``claude -p`` against ``ANTHROPIC_BASE_URL`` = the proxy's root; Anthropic Messages.

claude appends ``/v1/messages`` itself, so the base URL has no ``/v1``. Every model alias (main,
haiku/sonnet/opus defaults, subagents) is pinned to the served name so the extra calls claude-code makes
(titles, quota checks, small-model helpers) also reach the proxy. As root,
``--dangerously-skip-permissions`` needs ``IS_SANDBOX=1``. ``--max-turns`` bounds its loop. A system
prompt is ``--system-prompt`` with ``--tools Bash``.
"""

from __future__ import annotations

from harness_grpo.agents.spec import AgentCommand, AgentLaunch, AgentSpec, Install


def configure(launch: AgentLaunch) -> AgentCommand:
    model = launch.model
    argv = [
        launch.binary,
        "-p",
        launch.task,
        "--model",
        model,
        "--dangerously-skip-permissions",
        "--max-turns",
        str(launch.max_steps),
        "--output-format",
        "json",
    ]
    if launch.system_prompt is not None:
        argv += ["--system-prompt", launch.system_prompt, "--tools", "Bash"]
    return AgentCommand(
        argv=argv,
        env={
            "ANTHROPIC_BASE_URL": launch.base_url,
            "ANTHROPIC_API_KEY": launch.api_key,
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "CLAUDE_CODE_SUBAGENT_MODEL": model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",
        },
    )


SPEC = AgentSpec(
    name="claude-code",
    binary="claude",
    dialect="anthropic_messages",
    install=Install("npm", "@anthropic-ai/claude-code", "2.1.328"),
    configure=configure,
    max_steps=6,
)
