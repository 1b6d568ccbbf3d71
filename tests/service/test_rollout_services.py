"""``HarborSessionFactory`` against a real ``openenv harbor serve`` and against ours, on loopback.

Both services run as users run them, in their own processes, with the local sandbox, in front of one engine (the
warm tiny model behind a recording relay, the ground truth for what was sampled). The same client code (the
factory, driven by the trainer's own ``run_rollout``) runs a terminus-2 rollout on each: the rows are the tasks,
the trace is exactly the calls the engine served for that rollout (ids, logprobs, masks, the trainer's sampling
policy), the reward is the one the task's verifier wrote. Each service refuses an env session beyond its
``MAX_CONCURRENT_ENVS`` and a model call or a control-plane call with a key it never issued; the factory waits for
a slot rather than failing. Our service answers a request it cannot serve with a result that says why, a local
rollout its sandbox could not reach an external proxy for included.
"""

from __future__ import annotations

import pickle
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from openenv.harbor.client import HarborEnv

from harness_grpo.harbor_service_sessions import HarborSessionFactory, refused_for_capacity
from harness_grpo.openenv_harbor import install
from harness_grpo.rollouts import run_rollout
from harness_grpo.serve import RolloutRequest, RolloutService, pick_reward_key, training_policy
from harness_grpo.service_loop import ServiceLoop
from proxy.server import CaptureProxy, ProxyConfig
from tests.agents.conftest import RecordingRelay
from tests.service.conftest import (
    SERVICES,
    UNSOLVED,
    RelayedEngine,
    Service,
    make_task,
    make_tasks,
    start_service,
)
from tests.support.wait import until_blocking

POLICY = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
AGENT_TIMEOUT_S = 15.0

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tasks(tmp_path_factory.mktemp("dataset"))


@pytest.fixture(scope="module")
def services(
    relayed_engine: RelayedEngine, dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Service]]:
    logs = tmp_path_factory.mktemp("services")
    with ThreadPoolExecutor(2) as pool:
        started = [pool.submit(start_service, kind, dataset, relayed_engine.url, logs) for kind in SERVICES]
    running = {future.result().kind: future.result() for future in started}
    try:
        yield running
    finally:
        for service in running.values():
            service.process.stop()


def factory_on(service: Service, engine: RelayedEngine, **kwargs) -> HarborSessionFactory:
    """The factory as the trainer builds it: ``sampling=`` its policy."""
    settings = {
        "harness": "terminus-2",
        "sandbox": "local",
        "llm_url": engine.url,
        "agent_step_limit": 2,
        "agent_timeout_sec": AGENT_TIMEOUT_S,
        **kwargs,
    }
    return HarborSessionFactory(service.url, sampling=dict(POLICY), **settings)


def masks_allowed(kind: str, first: bool, n_prompt: int, n_completion: int) -> list[list[int]]:
    """A turn's loss mask: the prompt is context and the completion is trained.

    OpenEnv's terminus-2 runs until the agent timeout kills it, which may land after the engine served the second
    call but before terminus-2 logged it in its trajectory; OpenEnv's ATIF reconciliation then calls that call
    auxiliary and masks its whole completion (``atif_aux_calls``). The first call is always logged by then.
    """
    trained = [0] * n_prompt + [1] * n_completion
    if kind == "openenv" and not first:
        return [trained, [0] * (n_prompt + n_completion)]
    return [trained]


def test_the_same_client_code_drives_openenv_harbor_serve_and_ours(
    services: dict[str, Service], relayed_engine: RelayedEngine, dataset: Path
) -> None:
    relay = relayed_engine.relay
    for kind in SERVICES:
        factory = factory_on(services[kind], relayed_engine)
        rows = factory.prompt_rows()
        assert [(row["task_name"], row["task_index"]) for row in rows] == [("answer-a", 0), ("answer-b", 1)], kind
        assert rows[1]["prompt"] == [{"role": "user", "content": "Write 42 into /app/answer.txt (answer-b)."}]
        assert factory.split == str(dataset)
        factory = pickle.loads(pickle.dumps(factory))  # as TRL's spawned worker gets it: rows kept, no live client
        before = len(relay.served)
        outcome = run_rollout(factory, rows[1], seed=0, timeout_s=AGENT_TIMEOUT_S, sampling=POLICY)
        instruction = rows[1]["prompt"][0]["content"]
        # this rollout's calls: those carrying its task (the services' engine probes do not)
        served = [call for call in relay.served[before:] if instruction in str(call.request["messages"])]
        assert outcome.error is None, (kind, outcome.error)
        assert outcome.env_reward == UNSOLVED, (kind, outcome)  # what the task's verifier wrote
        turns = outcome.training_trace.turns
        assert len(turns) == len(served) == 2, (kind, len(turns), len(served))  # the call budget: 2
        for turn, call in zip(turns, served, strict=True):
            assert (turn.prompt_token_ids, turn.completion_token_ids, turn.per_token_logps) == (
                call.prompt_ids,
                call.completion_ids,
                call.logprobs,
            ), kind
            n_prompt, n_completion = len(turn.prompt_token_ids), len(turn.completion_token_ids)
            assert turn.loss_mask in masks_allowed(kind, turn is turns[0], n_prompt, n_completion), kind
            assert 0 < n_completion <= 48, kind
            assert POLICY.items() <= turn.metadata["sampling_params"].items(), kind
        if kind == "ours":  # terminus-2's turns end with the call budget; openenv's spins until its timeout
            assert not outcome.timed_out


def test_a_service_at_its_limit_refuses_the_next_env_session(services: dict[str, Service]) -> None:
    for kind in SERVICES:
        url = services[kind].url
        held = [HarborEnv(url), HarborEnv(url)]
        try:
            for env in held:
                env.reset()
            extra = HarborEnv(url)
            with pytest.raises(Exception) as refused:
                extra.reset()
            assert refused_for_capacity(refused.value), f"{kind}: {refused.value!r}"
            extra.close()
            held.pop().close()
            later = HarborEnv(url)
            held.append(later)

            def admitted(env: HarborEnv = later) -> bool:
                try:
                    env.reset()
                    return True
                except Exception as error:
                    if not refused_for_capacity(error):
                        raise
                    return False

            until_blocking(admitted, f"{kind}: a slot freed by a closed session was not given to the next", 30.0)
        finally:
            for env in held:
                env.close()


def test_sessions_beyond_the_limit_wait_for_a_slot(services: dict[str, Service], relayed_engine: RelayedEngine) -> None:
    """Three oracle rollouts at once on our service, which runs two: all three finish, one after waiting."""
    factory = factory_on(services["ours"], relayed_engine, harness="oracle")
    rows = factory.prompt_rows()
    sessions = [factory.create(rows[i % 2]["prompt"]) for i in range(3)]
    codes: list[int] = []
    lock = threading.Lock()

    def wait(session) -> None:
        code = session.wait_for_completion()
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=wait, args=(session,)) for session in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    try:
        assert codes == [0, 0, 0], [session.error for session in sessions]
        assert [session.verify().env_reward for session in sessions] == [1.0, 1.0, 1.0]
        assert any(session.waited_s > 0 for session in sessions), "no session was ever refused a slot"
        assert all(session.fetch_training_trace().turns == [] for session in sessions)  # oracle calls no model
    finally:
        for session in sessions:
            session.close()


def _status(url: str, key: str, body: bytes | None = None) -> int:
    """The HTTP status of a GET (a POST with ``body``) to ``url`` under ``key``."""
    request = urllib.request.Request(
        url, data=body, headers={"Authorization": f"Bearer {key}"}, method="GET" if body is None else "POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_keys_it_never_issued_are_refused(services: dict[str, Service]) -> None:
    chat = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    for kind in SERVICES:
        capture = services[kind].capture_url
        assert _status(f"{capture}/v1/chat/completions", "s" + "0" * 24, chat) == 401, kind  # an agent key
        assert _status(f"{capture}/sessions", "not-the-admin-key") == 401, kind  # the control plane


def test_our_service_says_why_it_cannot_run_a_request(
    services: dict[str, Service], relayed_engine: RelayedEngine, dataset: Path
) -> None:
    env = HarborEnv(services["ours"].url)
    try:
        cases = {
            "unknown split 'nope'; served splits are": {"split": "nope"},
            "task index 7 out of range": {"task_index": 7},
            "unknown harness 'no-such-agent'": {"harness": "no-such-agent"},
            "training sampling requires top_p=1.0": {"sampling": {"temperature": 1.0, "top_p": 0.9}},
            "purpose='eval' is not offered": {"purpose": "eval"},
            "unknown sandbox 'cloud'": {"sandbox": "cloud"},
        }
        for message, change in cases.items():
            request = {"split": str(dataset), "harness": "oracle", "sandbox": "local", **change}
            result = env.run_rollout(llm_url=relayed_engine.url, **request)
            assert not result.ok and message in (result.error or ""), (change, result.error)
            assert result.reward is None
    finally:
        env.close()
    factory = factory_on(services["ours"], relayed_engine)
    with pytest.raises(KeyError, match="build the dataset from prompt_rows"):
        factory.create([{"role": "user", "content": "a task the service does not have"}])


def test_our_service_refuses_a_local_rollout_when_its_external_proxy_is_not_on_127_0_0_1(
    relayed_engine: RelayedEngine, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local sandbox relays only ports of its host's 127.0.0.1: a proxy elsewhere (here 127.0.0.2, which is still
    loopback, so nothing is exposed) is one its agents cannot reach, and a local rollout is refused by name."""
    loop = ServiceLoop("proxy-elsewhere")
    config = ProxyConfig(relayed_engine.url, tmp_path / "journal", host="127.0.0.2", port=0, admin_key="elsewhere")
    proxy = CaptureProxy(config)
    url = f"http://127.0.0.2:{loop.run(proxy.start())}"
    monkeypatch.setenv("HARNESS_PROXY_ADMIN_KEY", "elsewhere")
    service = RolloutService(datasets=[str(dataset)], proxy_base_url=url)
    try:
        assert service.start() == url
        result = service.run(RolloutRequest(split=str(dataset), harness="oracle", sandbox="local"))
        assert not result.ok and f"reaches only this machine's loopback, not the capture proxy at {url}" in (
            result.error or ""
        ), result.error
    finally:
        service.stop()
        loop.run(proxy.stop())
        loop.close()


def test_the_openenv_wrapper_refuses_a_proxy_the_local_sandbox_cannot_reach(tmp_path: Path) -> None:
    install()
    from openenv.harbor import rollout

    task = make_task(tmp_path, "t")
    common = {
        "task_dir": task,
        "harness": "terminus-2",
        "session_id": "s" + "0" * 24,
        "model": "m",
        "trial_name": "t",
        "trials_dir": tmp_path / "trials",
    }
    config = rollout.build_trial_config(sandbox="local", intercept_url="http://127.0.0.1:8311", **common)
    assert config.environment.import_path == "harness_grpo.harbor_local:LocalEnvironment"
    assert config.environment.kwargs == {"allow_ports": [8311]} and config.environment.delete
    with pytest.raises(ValueError, match="serve with --expose direct"):
        rollout.build_trial_config(sandbox="local", intercept_url="https://x.gradio.live", **common)
    docker = rollout.build_trial_config(sandbox="docker", intercept_url="https://x.gradio.live", **common)
    assert docker.environment.type == "docker" and docker.environment.import_path is None


class KeyedEngine(RecordingRelay):
    """The engine behind a key: a request without ``Authorization: Bearer engine-key`` is a 401."""

    async def _forward(self, request):  # type: ignore[override]
        from aiohttp import web

        if request.headers.get("Authorization") != "Bearer engine-key":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        return await super()._forward(request)


def test_the_proxy_sends_the_engine_key_upstream(relayed_engine: RelayedEngine, tmp_path: Path) -> None:
    """What ``--api-key`` configures: ``ProxyConfig.engine_api_key`` reaches the engine on every call."""
    loop = ServiceLoop("keyed-engine")
    keyed = KeyedEngine(relayed_engine.engine.url)
    url = loop.run(keyed.start())
    try:
        for key, status in ((None, 502), ("engine-key", 201)):
            config = ProxyConfig(engine_url=url, journal_dir=tmp_path / str(key), port=0, engine_api_key=key)
            proxy = CaptureProxy(config)
            port = loop.run(proxy.start())
            try:
                body = b'{"purpose": "train", "sampling": {"temperature": 1.0}}'
                assert _status(f"http://127.0.0.1:{port}/sessions", proxy.admin_key, body) == status, key
            finally:
                loop.run(proxy.stop())
    finally:
        loop.run(keyed.stop())
        loop.close()


def test_a_session_closed_from_another_thread_stops_waiting(
    services: dict[str, Service], relayed_engine: RelayedEngine
) -> None:
    """The trainer's shutdown closes running sessions from its own thread: the wait returns, unscorable."""
    relay = relayed_engine.relay
    factory = factory_on(services["ours"], relayed_engine, agent_step_limit=0, agent_timeout_sec=20.0)
    session = factory.create(factory.prompt_rows()[0]["prompt"])
    before = len(relay.served)
    codes: list[int] = []
    waiting = threading.Thread(target=lambda: codes.append(session.wait_for_completion()))
    waiting.start()
    until_blocking(lambda: len(relay.served) > before, "the rollout never called the engine", 60.0)
    session.close()
    waiting.join(15.0)
    assert not waiting.is_alive(), "wait_for_completion did not return after close"
    assert codes == [1] and session.error, session.error
    assert session.verify().env_reward is None


def test_the_reward_is_the_named_key_else_the_only_one_else_reward() -> None:
    assert pick_reward_key({"score": 0.5}, "") == "score"
    assert pick_reward_key({"reward": 1.0, "style": 0.2}, "") == "reward"
    assert pick_reward_key({"reward": 1.0, "style": 0.2}, "missing, style") == "style"
    assert pick_reward_key({}, "") is None
    with pytest.raises(ValueError, match=r"several rewards .* none named reward: pass reward_key"):
        pick_reward_key({"a": 1.0, "b": 0.0}, "")
    with pytest.raises(ValueError, match="reward_key 'c' is not among"):
        pick_reward_key({"a": 1.0}, "c")


def test_the_sampling_a_rollout_names_is_openenvs_training_policy_in_our_fields() -> None:
    assert training_policy(None) == {}
    openenv_normalised = {"temperature": 0.5, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
    openenv_normalised |= {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}
    assert training_policy(openenv_normalised) == {
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    with pytest.raises(ValueError, match="finite positive temperature"):
        training_policy({"temperature": 0})
