"""One chat completion through the capture proxy as a rollout's session, from synchronous code.

``post_chat_completion(base_url, api_key, body, deadline)`` POSTs ``body`` to ``<base_url>/chat/completions``
(``base_url`` ends in ``/v1``) with the session's key and returns the whole parsed reply. It raises
``TimeoutError`` when ``deadline`` (a ``time.monotonic()`` value, None: no limit) has passed or passes during
the call, and ``ModelCallError`` (the HTTP status and the proxy's message) when the call fails.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any


class ModelCallError(RuntimeError):
    """A model call through the proxy failed (the HTTP status and the proxy's message)."""


def post_chat_completion(base_url: str, api_key: str, body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
    timeout = None if deadline is None else deadline - time.monotonic()
    if timeout is not None and timeout <= 0:
        raise TimeoutError("the rollout's time is up")
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ModelCallError(f"model call failed: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
    except TimeoutError:
        raise
    except OSError as exc:
        raise ModelCallError(f"model call failed: {exc}") from exc
