"""A minimal black-box coding agent: its own process, its own loop, HTTP only.

It reads ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``HARNESS_MODEL`` from
the environment (as a harness would give it), takes the task as its first
argument, and loops: ask the model (OpenAI chat completions, with tools),
execute every tool call it returns in the current directory, send the
results back, until the model calls ``submit``, answers without a tool call,
or ``--max-turns`` calls were made. It knows nothing about training: the
reward is decided later by the task's verifier looking at the directory.

Tools: ``list_files(directory)``, ``read_file(path)``, ``echo(text)``,
``submit(answer)`` (writes ``submission.txt`` and ends the run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                "required": list(params),
            },
        },
    }


SYSTEM_PROMPT = "You are a careful agent. Use the tools."
TOOLS = [
    _tool("list_files", "List the files in a directory.", directory="Directory path"),
    _tool("read_file", "Read a text file.", path="Path to the file"),
    _tool("echo", "Echo the given text back.", text="Text to echo"),
    _tool("submit", "Submit the final answer.", answer="The final answer"),
]


def run_tool(name: str, arguments: str, workdir: Path) -> tuple[str, bool]:
    """Execute one call in ``workdir``; ``(output, finished)``. Bad calls return an error text, never raise.

    ``list_files`` lists ``workdir`` whatever ``directory`` says; ``read_file`` reads only inside it.
    """
    try:
        args = json.loads(arguments or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
    except ValueError as exc:
        return f"error: invalid arguments ({exc})", False
    if name == "list_files":
        return "\n".join(sorted(p.name for p in workdir.iterdir())), False
    if name == "read_file":
        path = (workdir / str(args.get("path", ""))).resolve()
        if not path.is_relative_to(workdir.resolve()) or not path.is_file():
            return f"error: no such file {path.name}", False
        try:
            return path.read_text()[:4000], False
        except (OSError, UnicodeDecodeError) as exc:
            return f"error: cannot read {path.name} ({type(exc).__name__})", False
    if name == "echo":
        return str(args.get("text", "")), False
    if name == "submit":
        (workdir / "submission.txt").write_text(str(args.get("answer", "")))
        return "submitted", True
    return f"error: unknown tool {name}", False


def chat(base_url: str, api_key: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base_url.rstrip('/')}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=300.0)
    args = p.parse_args()
    base_url, api_key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    model = os.environ.get("HARNESS_MODEL", "default")
    workdir = Path.cwd()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": args.task},
    ]
    for _ in range(args.max_turns):
        body = {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": args.max_tokens}
        try:
            reply = chat(base_url, api_key, body, args.timeout_s)
        except urllib.error.HTTPError as exc:
            print(f"model call failed: {exc.code} {exc.read()[:300]!r}", file=sys.stderr)
            return 2
        message = reply["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls or None})
        if not calls:
            print(f"answer: {message.get('content')!r}")
            return 0
        finished = False
        for call in calls:
            output, done = run_tool(call["function"]["name"], call["function"]["arguments"], workdir)
            print(f"{call['function']['name']}({call['function']['arguments']}) -> {output[:80]!r}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            finished = finished or done
        if finished:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
