"""Echo environment types, as OpenEnv's ``echo_env`` (EchoAction variant) defines them."""

from __future__ import annotations

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class EchoAction(Action):
    """A message for the environment to echo back."""

    message: str = Field(..., min_length=1, description="Message to echo back")


class EchoObservation(Observation):
    """The echoed message and its length."""

    echoed_message: str = Field(..., description="The echoed message from the environment")
    message_length: int = Field(default=0, ge=0, description="Length of the echoed message")
