"""What the trainer hands its own session factories: the proxy, the budgets, one proxy session per rollout.

``RolloutContext`` is the explicit channel of ``TrainerBoundSessionFactory.bind_rollout``: a
third-party factory never sees it. ``ProxySessionLease`` is one rollout's train session on the
proxy, created with the trainer's sampling policy and budgets; its ``key`` is the API key the
agent's model client sends, so every call it makes lands in that session. ``connect_proxy`` checks a capture
proxy running elsewhere (``python -m proxy``) before the trainer or the rollout service uses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.client import ProxyAdminClient, ProxyClientError
from proxy.trace import TrainingTrace

PROXY_ADMIN_KEY_ENV = "HARNESS_PROXY_ADMIN_KEY"


class ServicesError(RuntimeError):
    """The run's services cannot start; the message says what to fix."""


class EngineNotTokenExact(ServicesError):
    """The engine does not return what training needs: exact token ids and processed logprobs."""


@dataclass(frozen=True)
class ProxyEndpoint:
    """Where agents reach the capture proxy and how the trainer controls it."""

    base_url: str  # http://host:port (agents append /v1 or the dialect's path)
    admin_key: str


def connect_proxy(
    url: str, *, sampling: dict[str, Any], name: str, probe: str, llm_url: str | None = None
) -> ProxyEndpoint:
    """The running proxy at ``url``, checked before any rollout: it answers, takes the admin key
    (``HARNESS_PROXY_ADMIN_KEY``), and opens a train session (on ``llm_url``, else its default engine), which it
    does only for a token-exact engine. ``ServicesError`` (``EngineNotTokenExact``) names ``name``, the setting
    that gave ``url``, and what to fix; ``probe`` is the probe session's metadata."""
    url = url.rstrip("/")
    key = os.environ.get(PROXY_ADMIN_KEY_ENV)
    if not key:
        raise ServicesError(f"{name}={url}: set {PROXY_ADMIN_KEY_ENV} to that proxy's admin key")
    admin = ProxyAdminClient(url, key, timeout_s=60)
    engine = {"llm_url": llm_url} if llm_url else {}
    try:
        session = admin.create_session(purpose="train", sampling=sampling, metadata={"probe": probe}, **engine)
    except ProxyClientError as exc:
        if exc.status == 401:
            raise ServicesError(f"the proxy at {url} refused {PROXY_ADMIN_KEY_ENV}: {exc}") from None
        if exc.status == 400 and "tier" in str(exc):
            raise EngineNotTokenExact(f"the proxy at {url} cannot open train sessions: {exc}") from None
        raise ServicesError(f"the proxy at {url} cannot open sessions: {exc}") from None
    admin.delete(session.session_id)
    return ProxyEndpoint(url, key)


@dataclass(frozen=True)
class RolloutContext:
    """The trainer's rollout side, bound to our factories before the first session.

    ``sampling`` is the policy every session pins (the same dict the factory was built with);
    ``max_model_calls`` and ``max_output_tokens`` are the proxy's per-session budgets (None:
    unlimited); ``model_name`` is the name agents send as their model; ``engine_url``/``engine_model`` pin the
    engine (and its served model) the sessions' calls go to (None: the proxy's default engine, its first model).
    """

    proxy: ProxyEndpoint
    sampling: dict[str, Any] = field(default_factory=dict)
    max_model_calls: int | None = None
    max_output_tokens: int | None = None
    model_name: str = "policy"
    engine_url: str | None = None
    engine_model: str | None = None

    def admin(self) -> ProxyAdminClient:
        return ProxyAdminClient(self.proxy.base_url, self.proxy.admin_key)

    def lease(self, metadata: dict[str, Any], *, max_model_calls: int | None = None) -> ProxySessionLease:
        """A new train session on the proxy (``max_model_calls`` overrides the context's budget)."""
        return ProxySessionLease(
            self.admin(),
            sampling=self.sampling,
            max_model_calls=self.max_model_calls if max_model_calls is None else max_model_calls,
            max_output_tokens=self.max_output_tokens,
            metadata=metadata,
            engine={key: value for key, value in (("llm_url", self.engine_url), ("model", self.engine_model)) if value},
        )


class ProxySessionLease:
    """One rollout's train session on the proxy: created with the trainer's sampling policy and budget (and, when
    ``engine`` names them, its ``llm_url`` and served ``model``).

    ``key`` is what the model client sends as its API key (None once released); ``session_id`` names the
    session on the proxy's control plane; ``trace()`` is everything captured under the key; ``release()``
    deletes the session and never raises (closing must not mask the rollout's outcome).
    """

    def __init__(
        self,
        admin: ProxyAdminClient,
        *,
        sampling: dict[str, Any],
        max_model_calls: int | None,
        max_output_tokens: int | None,
        metadata: dict[str, Any],
        engine: Mapping[str, str] | None = None,
    ) -> None:
        self._admin = admin
        session = admin.create_session(
            purpose="train",
            sampling=sampling,
            max_model_calls=max_model_calls,
            max_output_tokens=max_output_tokens,
            metadata=metadata,
            **(engine or {}),
        )
        self.session_id = session.session_id
        self.key: str | None = session.api_key

    def trace(self) -> TrainingTrace:
        assert self.key is not None, "the session was released"
        return self._admin.trace(self.session_id)

    def release(self) -> None:
        if self.key is not None:
            with contextlib.suppress(ProxyClientError):
                self._admin.delete(self.session_id)
            self.key = None


class BoundSessionFactory:
    """The shared part of our ``TrainerBoundSessionFactory``s: the bound context, and ``create(prompt)``
    (what a third-party caller such as TRL's ``HarnessRolloutWorker`` uses) as a row holding only the prompt.

    Outside our trainer nobody calls ``bind_rollout``: such a caller builds the factory with
    ``rollout_context=RolloutContext(ProxyEndpoint(proxy_url, admin_key), ...)`` (a capture proxy it started,
    ``python -m proxy``), whose ``sampling`` is replaced by the factory's own (the policy the caller passed).
    A context ``bind_rollout`` gives later wins. Factories hold no live client, so they pickle (TRL's worker runs
    them in a spawned process).
    """

    context: RolloutContext | None = None

    def bind_standalone(self, rollout_context: RolloutContext | None, sampling: dict[str, Any]) -> None:
        """Bind ``rollout_context`` (when given) with ``sampling`` as its policy: a factory no trainer of ours binds."""
        if rollout_context is not None:
            self.context = dataclasses.replace(rollout_context, sampling=dict(sampling))

    def bind_rollout(self, context: RolloutContext) -> None:
        self.context = context

    def bound_context(self) -> RolloutContext:
        """The context bound so far; ``RuntimeError`` saying how to bind one when there is none."""
        if self.context is None:
            raise RuntimeError(
                f"{type(self).__name__} is not bound to a proxy: our trainer calls bind_rollout; any other caller "
                "(TRL's HarnessRolloutWorker) builds it with rollout_context=RolloutContext(ProxyEndpoint(url, "
                "admin_key)) of a running capture proxy (python -m proxy)"
            )
        return self.context

    def create(self, prompt: Any, seed: int | None = None, episode_id: str | None = None) -> Any:
        return self.create_from_row({"prompt": prompt}, seed=seed or 0, episode_id=episode_id or uuid.uuid4().hex)

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> Any:
        raise NotImplementedError
