"""A blocking client for the proxy's control plane (stdlib only).

Contract: every method is one HTTP call with a timeout; a non-2xx answer
raises ``ProxyClientError`` carrying the status and the proxy's message, a
connection failure or timeout raises it with status 0. Safe to use from many
threads at once (no shared connection).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from proxy.trace import TrainingTrace


class ProxyClientError(RuntimeError):
    """The proxy refused or could not be reached (``status`` 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"proxy answered {status}: {message}" if status else f"proxy unreachable: {message}")
        self.status = status


@dataclass(frozen=True)
class ProxySession:
    """A session the proxy opened: ``session_id`` names it on the control plane; ``api_key`` is the secret its
    agent sends (left out of ``repr``, so logging the handle never logs the key)."""

    session_id: str
    api_key: str = field(repr=False)


class ProxyAdminClient:
    """Create, inspect and delete sessions; fetch their traces."""

    def __init__(self, base_url: str, admin_key: str, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {admin_key}", "Content-Type": "application/json"}
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = raw[:300].decode("utf-8", "replace")
            raise ProxyClientError(exc.code, message) from None
        except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as exc:
            raise ProxyClientError(0, f"{type(exc).__name__}: {exc}") from None

    def create_session(self, **config: Any) -> ProxySession:
        """Open a session (``SessionConfig`` fields, optional ``session_id``); its id and its agent's API key."""
        answer = json.loads(self._call("POST", "/sessions", config))
        return ProxySession(answer["session_id"], answer["api_key"])

    def describe(self, session_id: str) -> dict[str, Any]:
        """The session's settings and stats."""
        return json.loads(self._call("GET", f"/sessions/{session_id}"))

    def trace(self, session_id: str) -> TrainingTrace:
        """The session's ``TrainingTrace`` (validated on the way in)."""
        return TrainingTrace.from_json(self._call("GET", f"/sessions/{session_id}/trace"))

    def sequences(self, session_id: str) -> list[dict[str, Any]]:
        """The session's training sequences (one per root-to-leaf path)."""
        return json.loads(self._call("GET", f"/sessions/{session_id}/sequences"))["sequences"]

    def delete(self, session_id: str) -> None:
        """Forget the session and its journal."""
        self._call("DELETE", f"/sessions/{session_id}")
