"""``EchoToolEnv``: the echo environment as a TRL ``environment_factory`` class."""

from __future__ import annotations

from typing import Any

from harness_grpo.envs.echo.client import EchoEnv
from harness_grpo.envs.echo.models import EchoAction
from harness_grpo.envs.tool_env import EpisodeToolEnv


class EchoToolEnv(EpisodeToolEnv):
    """One tool, ``echo``; ``reward`` is the last echo's reward (0.1 per character).

    The server URL is ``base_url=`` or ``$ECHO_ENV_URL``.
    """

    url_variable = "ECHO_ENV_URL"
    server_name = "echo"
    client_class = EchoEnv

    def reset(self, **kwargs: Any) -> str | None:
        """Start a new episode on its own server session; the echo game has no opening text."""
        self._start_episode()
        return None

    def echo(self, message: str) -> str:
        """Echo a message back from the environment.

        Args:
            message: The message to echo.

        Returns:
            The echoed message.
        """
        return self._play(EchoAction(message=message)).observation.echoed_message
