"""Grades /app/wc.py on four hidden command-line checks; reward = fraction passed."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

FILES = {
    "poem.txt": "roses are red\nviolets are blue\n\nsugar is sweet\n",
    "ragged.txt": "  several   spaces\tand a tab\nno final newline",
}


def run(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(
            [sys.executable, "-I", "/app/wc.py", *args], capture_output=True, text=True, timeout=10, cwd="/app"
        )
    except (OSError, subprocess.SubprocessError):
        return None


def counts(text: str) -> str:
    data = text.encode()
    return " ".join(str(n) for n in (data.count(b"\n"), len(data.split()), len(data)))


def grade() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: Path(tmp) / name for name in FILES}
        for name, text in FILES.items():
            paths[name].write_text(text)
        full = [run(str(paths[name])) for name in FILES]
        lines = run("-l", str(paths["poem.txt"]))
        missing = run(str(Path(tmp) / "absent.txt"))
    checks = {
        "full_poem": full[0] is not None
        and full[0].returncode == 0
        and full[0].stdout.strip() == counts(FILES["poem.txt"]),
        "full_ragged": full[1] is not None
        and full[1].returncode == 0
        and full[1].stdout.strip() == counts(FILES["ragged.txt"]),
        "lines_only": lines is not None
        and lines.returncode == 0
        and lines.stdout.strip() == str(FILES["poem.txt"].count("\n")),
        "missing_file": missing is not None
        and missing.returncode == 1
        and missing.stdout == ""
        and missing.stderr.strip() != "",
    }
    return {"reward": sum(checks.values()) / len(checks), **{k: int(v) for k, v in checks.items()}}


print(json.dumps(grade()))
