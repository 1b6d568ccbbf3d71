"""FakeHub: a stand-in for the Hugging Face Hub (unreachable from the test machines) serving one directory as a
dataset repo at one commit, over the routes ``huggingface_hub.snapshot_download`` uses: repo info, the recursive
file tree, and file downloads (HEAD and GET). The real client code is what calls it (``HF_ENDPOINT``)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serves ``root`` as the dataset repo ``repo_id`` at revision ``main`` (commit ``COMMIT``) on 127.0.0.1."""

    def __init__(self, repo_id: str, root: Path) -> None:
        self.repo_id, self.root = repo_id, root
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def files(self) -> list[Path]:
        return sorted(path for path in self.root.rglob("*") if path.is_file())

    def file(self, revision: str, relative: str) -> Path | None:
        path = (self.root / relative).resolve()
        known = revision in ("main", COMMIT) and path.is_relative_to(self.root.resolve()) and path.is_file()
        return path if known else None


def _etag(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    api = f"/api/datasets/{hub.repo_id}/"
    resolve = f"/datasets/{hub.repo_id}/resolve/"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _json(self, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _not_found(self) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _file(self, with_body: bool) -> None:
            revision, _, relative = unquote(urlsplit(self.path).path)[len(resolve) :].partition("/")
            path = hub.file(revision, relative)
            if path is None:
                self._not_found()
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{_etag(data)}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if with_body:
                self.wfile.write(data)

        def do_HEAD(self) -> None:
            if self.path.startswith(resolve):
                self._file(with_body=False)
            else:
                self._not_found()

        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            if path.startswith(resolve):
                self._file(with_body=True)
            elif path.startswith(api + "revision/"):
                siblings = [{"rfilename": p.relative_to(hub.root).as_posix()} for p in hub.files()]
                self._json({"id": hub.repo_id, "sha": COMMIT, "private": False, "siblings": siblings})
            elif path.startswith(api + "tree/"):
                self._json(
                    [
                        {
                            "type": "file",
                            "path": p.relative_to(hub.root).as_posix(),
                            "size": p.stat().st_size,
                            "oid": _etag(p.read_bytes()),
                        }
                        for p in hub.files()
                    ]
                )
            else:
                self._not_found()

    return Handler
