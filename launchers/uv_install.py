"""``uv pip install ARGS`` into this interpreter's environment, from the package sources pip is configured with.

uv downloads and installs in parallel (the project's dependencies in about a quarter of pip's time) but reads no
pip configuration, so this passes it what ``pip config list`` holds (config files and ``PIP_*`` variables, with
pip's precedence: a variable over an ``[install]`` setting over a ``[global]`` one): the index, the extra indexes,
the find-links folders, the constraints files and the CA bundle. Indexes are searched as pip searches them, for
the best version across all of them.

    .venv/bin/python launchers/uv_install.py -e ".[dev]"

``uv`` must be installed in the same environment (``launchers/setup.sh`` does both).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
SCOPES = (":env:", "install", "global")  # pip's precedence, first wins


def pip_settings() -> dict[str, str]:
    """Each setting ``pip config list`` shows, by key, at pip's precedence."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    scoped: dict[tuple[str, str], str] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        scope, _, key = name.rpartition(".")
        scoped[(scope, key)] = " ".join(shlex.split(value))
    settings: dict[str, str] = {}
    for scope in reversed(SCOPES):
        settings.update({key: value for (where, key), value in scoped.items() if where == scope})
    return settings


def uv_command(args: list[str], settings: dict[str, str]) -> list[str]:
    """The ``uv pip install`` argv for ``args`` under pip's ``settings``."""
    uv = Path(sys.executable).with_name("uv")
    command = [str(uv), "pip", "install", "--python", sys.executable, "--index-strategy", "unsafe-best-match"]
    for key, option in OPTIONS.items():
        for value in settings.get(key, "").split():
            command += [option, value]
    return command + args


def main() -> int:
    settings = pip_settings()
    env = dict(os.environ)
    if "cert" in settings:
        env.setdefault("SSL_CERT_FILE", settings["cert"])
    return subprocess.run(uv_command(sys.argv[1:], settings), env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
