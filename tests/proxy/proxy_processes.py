"""The proxy and the fake engine as child processes (``python -m proxy``), optionally under resource limits.

``fake_engine()`` is ``bench/fake_vllm.py`` once it serves (``url(engine)`` is its base URL).
``proxy(engine_url, journal_dir, limits={resource.RLIMIT_NOFILE: 1024})`` starts the proxy with
admin key ``ADMIN_KEY`` on a free port, with each soft limit set before it imports anything, and
returns once it prints its listening line (``url(proxy)``; ``proxy.match["counts"]`` is the rest of
that line). ``open_files_under(pid, directory)`` lists the descriptors of ``pid`` open on files in
``directory``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from tests.support.processes import ReadyProcess

ADMIN_KEY = "adm"
FAKE_VLLM_READY = re.compile(r"fake vLLM on (http://\S+)")
PROXY_READY = re.compile(r"proxy listening on (?P<url>http://\S+) (?P<counts>.*)")

# Sets the soft limits given as argv[1] ("kind=value,..."), then runs ``python -m proxy`` with the rest.
_LIMITED = """\
import resource, runpy, sys
for item in filter(None, sys.argv[1].split(",")):
    kind, soft = (int(v) for v in item.split("="))
    resource.setrlimit(kind, (soft, resource.getrlimit(kind)[1]))
sys.argv = ["proxy", *sys.argv[2:]]
runpy.run_module("proxy", run_name="__main__", alter_sys=True)
"""


def url(process: ReadyProcess) -> str:
    return process.match.group(1)


def fake_engine() -> ReadyProcess:
    return ReadyProcess([sys.executable, "bench/fake_vllm.py"], FAKE_VLLM_READY, timeout_s=30)


def proxy(
    engine_url: str, journal_dir: Path, *args: str, limits: dict[int, int] | None = None, timeout_s: float = 120
) -> ReadyProcess:
    spec = ",".join(f"{kind}={soft}" for kind, soft in (limits or {}).items())
    argv = [sys.executable, "-c", _LIMITED, spec, "--engine-url", engine_url, "--journal-dir", str(journal_dir)]
    argv += ["--port", "0", "--admin-key", ADMIN_KEY, *args]
    return ReadyProcess(argv, PROXY_READY, timeout_s=timeout_s)


def open_files_under(pid: int, directory: Path) -> list[str]:
    """Targets of ``pid``'s descriptors that are (or were, if deleted) files in ``directory``."""
    prefix = str(directory.resolve()) + os.sep
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith(prefix):
            targets.append(target)
    return targets


def soft_limit(pid: int, name: str) -> int:
    """The soft limit ``name`` (as /proc/PID/limits spells it, e.g. "Max open files") of ``pid``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            return int(line[len(name) :].split()[0])
    raise KeyError(name)
