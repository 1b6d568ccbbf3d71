"""Errors the engine reports over HTTP, in vLLM's current OpenAI-style shape.

Contract: an ``EngineError`` carries the HTTP status, a message and the request
field at fault; ``error_body`` renders ``{"error": {"message", "type", "param",
"code"}}`` where ``type`` is vLLM's name for the status (``BadRequestError``,
``NotFoundError``, ...) and ``code`` is the status as an int.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestEntityTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


class EngineError(Exception):
    """A request the engine refuses or could not serve; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def bad_request(message: str, param: str | None = None) -> EngineError:
    """A 400 ``EngineError``."""
    return EngineError(400, message, param)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an error response."""
    error_type = ERROR_TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}
