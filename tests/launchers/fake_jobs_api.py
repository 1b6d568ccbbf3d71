"""FakeJobsAPI: a stand-in for the Hugging Face Jobs API (a paid remote service, unreachable from the test machines).

It serves, on 127.0.0.1, the two routes ``HfApi.run_job`` calls: ``GET /api/whoami-v2`` (the token's user, for the
default namespace) and ``POST /api/jobs/<namespace>`` (answered as the Hub answers: the job as created, ``RUNNING``),
and records every request (method, path, headers, JSON body) in ``requests``. The real ``huggingface_hub`` client is
what calls it (``HF_ENDPOINT``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

USER = "tester"
JOB_ID = "6842f1c0a1b2c3d4e5f60718"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: Any


class FakeJobsAPI:
    """The Jobs API's submission routes (module docstring); use as a context manager."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeJobsAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def submissions(self) -> list[Recorded]:
        return [request for request in self.requests if request.method == "POST"]


def _handler(api: FakeJobsAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self, body: Any) -> None:
            headers = {key.lower(): value for key, value in self.headers.items()}
            api.requests.append(Recorded(self.command, self.path, headers, body))

        def do_GET(self) -> None:
            self._record(None)
            if self.path == "/api/whoami-v2":
                self._answer(200, {"type": "user", "id": "u1", "name": USER, "fullname": "Tester", "orgs": []})
            else:
                self._answer(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
            self._record(body)
            namespace = self.path.removeprefix("/api/jobs/")
            if not self.path.startswith("/api/jobs/") or "/" in namespace:
                self._answer(404, {"error": f"no route {self.path}"})
                return
            owner = {"id": "u1", "name": namespace, "type": "user"}
            job = {**body, "id": JOB_ID, "owner": owner, "status": {"stage": "RUNNING", "message": None}}
            job["secrets"] = dict.fromkeys(body.get("secrets") or {}, "******")  # the Hub never echoes values
            self._answer(200, job)

    return Handler
