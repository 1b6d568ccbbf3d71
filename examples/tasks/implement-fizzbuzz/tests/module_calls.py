"""Runs calls into an agent-written module in a child Python, so its code never runs in the grader.

As a script (the child): imports the module named in argv[1] from /app, reads [[function, args], ...] as one JSON
line on stdin and writes the JSON list of results as its last stdout line (null for a call that raised or returned
something that is not JSON). Imported (the grader): run_cases() starts that child and returns its results.
"""

import json
import subprocess
import sys


def run_cases(module: str, calls: list) -> list:
    """Results of module.function(*args) for each [function, args] in calls; None where the call failed."""
    try:
        proc = subprocess.run(
            [sys.executable, "-I", __file__, module],
            input=json.dumps(calls) + "\n",
            capture_output=True,
            text=True,
            timeout=20,
            cwd="/app",
        )
        results = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return [None] * len(calls)
    if not isinstance(results, list) or len(results) != len(calls):
        return [None] * len(calls)
    return results


def _encodable(value):
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value


def _call_all() -> None:
    sys.path.insert(0, "/app")
    module = __import__(sys.argv[1])
    results = []
    for name, args in json.loads(sys.stdin.readline()):
        try:
            results.append(_encodable(getattr(module, name)(*args)))
        except Exception:
            results.append(None)
    sys.stdout.write("\n" + json.dumps(results) + "\n")


if __name__ == "__main__":
    _call_all()
