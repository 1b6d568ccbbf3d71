"""The echo environment: ``EchoEnv`` client, ``EchoAction``/``EchoObservation``, ``EchoToolEnv``."""

from harness_grpo.envs.echo.client import EchoEnv
from harness_grpo.envs.echo.models import EchoAction, EchoObservation
from harness_grpo.envs.echo.tools import EchoToolEnv

__all__ = ["EchoAction", "EchoEnv", "EchoObservation", "EchoToolEnv"]
