"""A captured multi-turn tool chat on the embedded CPU default, end to end.

Starts the embedded engine (tiny model) and the capture proxy on loopback,
opens a training session, and drives a small tool-using chat loop through the
proxy's OpenAI endpoint: every assistant turn the model samples is printed,
its tool calls are executed against a scratch directory, and at the end the
session's ``TrainingTrace`` is fetched, validated under OpenEnv's schema and
written to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from openenv.core.harness.training import TrainingTrace as OpenEnvTrainingTrace
from rich.console import Console

from harness_grpo.engine import EmbeddedEngine, EngineServer
from proxy.server import CaptureProxy, ProxyConfig

console = Console()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the workspace and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"filePath": {"type": "string", "description": "Path of the file."}},
                "required": ["filePath"],
            },
        },
    },
]


def run_tool(call: dict[str, Any], workspace: Path) -> str:
    """Execute one tool call against ``workspace``; errors become the tool's output."""
    name = call["function"]["name"]
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except json.JSONDecodeError as exc:
        return f"error: arguments are not JSON ({exc})"
    if name == "read":
        path = (workspace / str(args.get("filePath", ""))).resolve()
        if workspace.resolve() not in path.parents or not path.is_file():
            return f"error: no such file: {args.get('filePath')}"
        return path.read_text()[:2000]
    if name == "bash":
        command = str(args.get("command", ""))
        if command.split()[:1] == ["ls"]:
            return "\n".join(sorted(p.name for p in workspace.iterdir()))
        return f"(sandboxed demo: only 'ls' runs; got {command!r})"
    return f"error: unknown tool {name!r}"


async def chat(args: argparse.Namespace) -> Path:
    engine = EmbeddedEngine(args.model).start()
    engine_server = EngineServer(engine)
    workspace = Path(tempfile.mkdtemp(prefix="chat-demo-"))
    (workspace / "README.md").write_text("# demo\nThe answer is 42.\n")
    journal = args.output_dir / "journal"
    proxy = CaptureProxy(ProxyConfig(engine_url=await engine_server.start(), journal_dir=journal, port=0))
    try:
        url = f"http://127.0.0.1:{await proxy.start()}"
        admin = {"Authorization": f"Bearer {proxy.admin_key}"}
        async with aiohttp.ClientSession() as http:
            body = {"sampling": {"temperature": args.temperature}, "max_output_tokens": args.max_tokens}
            async with http.post(f"{url}/sessions", json=body, headers=admin) as resp:
                session = await resp.json()
                if resp.status != 201:
                    raise SystemExit(f"could not open a session: {session}")
            key = session["api_key"]
            console.print(f"[bold]engine[/] {engine.served_model_name} ({engine.model_path})  [bold]proxy[/] {url}")
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You are a coding agent. Use the tools to inspect the workspace."},
                {"role": "user", "content": "What is the answer written in README.md?"},
            ]
            for turn in range(args.turns):
                payload = {"model": "tiny", "messages": messages, "tools": TOOLS, "seed": args.seed + turn}
                async with http.post(
                    f"{url}/v1/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
                ) as resp:
                    reply = await resp.json()
                    if resp.status != 200:
                        raise SystemExit(f"turn {turn}: {resp.status} {reply}")
                message = reply["choices"][0]["message"]
                calls = message.get("tool_calls") or []
                console.print(f"[cyan]turn {turn}[/] sampled: {message.get('content')!r}")
                for call in calls:
                    console.print(f"  tool call {call['function']['name']}({call['function']['arguments']})")
                messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls or None})
                for call in calls:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_tool(call, workspace)})
                if not calls:
                    messages.append({"role": "user", "content": "Keep going: use a tool."})
            async with http.get(f"{url}/sessions/{key}/trace", headers=admin) as resp:
                trace_json = await resp.read()
            async with http.delete(f"{url}/sessions/{key}", headers=admin) as resp:  # saved below; journal freed
                resp.raise_for_status()
        trace = OpenEnvTrainingTrace.model_validate_json(trace_json)
        out = args.output_dir / "trace.json"
        out.write_bytes(trace_json)
        trained = sum(sum(t.loss_mask) for t in trace.turns)
        console.print(
            f"[bold green]captured[/] {len(trace.turns)} turns, "
            f"{sum(len(t.completion_token_ids) for t in trace.turns)} sampled tokens ({trained} trainable), "
            f"valid under OpenEnv's TrainingTrace -> {out}"
        )
        return out
    finally:
        await proxy.stop()
        await engine_server.stop()
        engine.stop()
        shutil.rmtree(workspace, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-warm", help="'tiny-warm' (default), 'tiny', a path or a hub id")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", type=Path, default=Path("outputs/chat_demo"))
    args = p.parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(chat(args))


if __name__ == "__main__":
    main()
