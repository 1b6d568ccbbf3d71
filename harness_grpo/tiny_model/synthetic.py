"""Deterministic synthetic tool-use chats for the tiny model's warm start.

Contract: ``synthetic_chats(n, seed, group_size)`` returns ``n`` chats, each a
dict with ``messages`` (OpenAI chat shape) and ``tools`` (OpenAI function
tools); the same arguments give the same chats, and each run of ``group_size``
chats shares its system prompt and tool list. A chat is an optional system
prompt (short, medium, or a long agent-style prompt of filler instructions), a
user task, 1-6 assistant turns that each make one tool call followed by its
tool result, and a final assistant text answer; a few chats are a greeting and
a direct answer with no tool call, and generic-tool chats are 1-3 exchanges
of one request, one call, its result and a short reply. Coding chats end their calls with a passing
test run (earlier test runs fail), so "tests pass" is the cue to stop. Every
tool call names a tool in its chat's ``tools`` and has arguments valid for
that tool's schema, in one fixed shape per tool.

Tool sets use the real names and argument shapes that opencode, claude-code
and codex send, plus generic function names; sets are subsets of a family
(always with its shell tool, which calls favour), sometimes shuffled,
sometimes with generic tools appended. Argument values come from small pools:
the aim is well-formed calls to listed tools, not varied content.
``heldout_prompts`` cuts chats just before an assistant tool-call turn, for
evaluation with a different seed.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Args = dict[str, Any]


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _s(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


def _n(description: str) -> dict[str, str]:
    return {"type": "number", "description": description}


def _b(description: str) -> dict[str, str]:
    return {"type": "boolean", "description": description}


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


_TODO_STATUS = {"type": "string", "enum": ["pending", "in_progress", "completed"]}

OPENCODE_TOOLS = [
    _tool(
        "bash",
        "Executes a given bash command in a persistent shell session with optional timeout, ensuring proper "
        "handling and security measures. Always quote file paths that contain spaces.",
        _obj(
            {
                "command": _s("The command to execute"),
                "timeout": _n("Optional timeout in milliseconds"),
                "description": _s("Clear, concise description of what this command does in 5-10 words."),
            },
            ["command"],
        ),
    ),
    _tool(
        "read",
        "Reads a file from the local filesystem. The filePath parameter must be an absolute path. By default it "
        "reads up to 2000 lines starting from the beginning of the file.",
        _obj(
            {
                "filePath": _s("The path to the file to read"),
                "offset": _n("The line number to start reading from (0-based)"),
                "limit": _n("The number of lines to read (defaults to 2000)"),
            },
            ["filePath"],
        ),
    ),
    _tool(
        "write",
        "Writes a file to the local filesystem. This tool will overwrite the existing file if there is one.",
        _obj(
            {
                "filePath": _s("The absolute path to the file to write (must be absolute, not relative)"),
                "content": _s("The content to write to the file"),
            },
            ["filePath", "content"],
        ),
    ),
    _tool(
        "edit",
        "Performs exact string replacements in files. The edit will fail if oldString is not found in the file.",
        _obj(
            {
                "filePath": _s("The absolute path to the file to modify"),
                "oldString": _s("The text to replace"),
                "newString": _s("The text to replace it with (must be different from oldString)"),
                "replaceAll": _b("Replace all occurrences of oldString (default false)"),
            },
            ["filePath", "oldString", "newString"],
        ),
    ),
    _tool(
        "glob",
        "Fast file pattern matching tool that works with any codebase size. Supports glob patterns like "
        '"**/*.js" or "src/**/*.ts". Returns matching file paths sorted by modification time.',
        _obj(
            {
                "pattern": _s("The glob pattern to match files against"),
                "path": _s("The directory to search in. Defaults to the current working directory."),
            },
            ["pattern"],
        ),
    ),
    _tool(
        "grep",
        "Fast content search tool. Searches file contents using regular expressions and returns file paths "
        "with at least one match.",
        _obj(
            {
                "pattern": _s("The regex pattern to search for in file contents"),
                "path": _s("The directory to search in. Defaults to the current working directory."),
                "include": _s('File pattern to include in the search (e.g. "*.js", "*.{ts,tsx}")'),
            },
            ["pattern"],
        ),
    ),
    _tool(
        "list",
        "Lists files and directories in a given path. The path parameter must be absolute; omit it to use the "
        "current workspace directory.",
        _obj(
            {
                "path": _s("The absolute path to the directory to list (must be absolute, not relative)"),
                "ignore": {"type": "array", "items": {"type": "string"}, "description": "List of glob patterns"},
            },
            [],
        ),
    ),
    _tool(
        "todowrite",
        "Use this tool to create and manage a structured task list for your current coding session.",
        _obj(
            {
                "todos": {
                    "type": "array",
                    "description": "The updated todo list",
                    "items": _obj(
                        {
                            "content": _s("Brief description of the task"),
                            "status": _TODO_STATUS,
                            "priority": {"type": "string", "enum": ["high", "medium", "low"]},
                            "id": _s("Unique identifier for the todo item"),
                        },
                        ["content", "status", "priority", "id"],
                    ),
                }
            },
            ["todos"],
        ),
    ),
    _tool("todoread", "Use this tool to read your todo list.", _obj({}, [])),
    _tool(
        "webfetch",
        "Fetches content from a specified URL and returns it in the requested format.",
        _obj(
            {
                "url": _s("The URL to fetch content from"),
                "format": {"type": "string", "enum": ["text", "markdown", "html"]},
                "timeout": _n("Optional timeout in seconds (max 120)"),
            },
            ["url", "format"],
        ),
    ),
    _tool(
        "task",
        "Launch a new agent to handle complex, multi-step tasks autonomously.",
        _obj(
            {
                "description": _s("A short (3-5 words) description of the task"),
                "prompt": _s("The task for the agent to perform"),
                "subagent_type": _s("The type of specialized agent to use for this task"),
            },
            ["description", "prompt", "subagent_type"],
        ),
    ),
]

CLAUDE_CODE_TOOLS = [
    _tool(
        "Task",
        "Launch a new agent to handle complex, multi-step tasks autonomously.",
        _obj(
            {
                "description": _s("A short (3-5 word) description of the task"),
                "prompt": _s("The task for the agent to perform"),
                "subagent_type": _s("The type of specialized agent to use for this task"),
            },
            ["description", "prompt", "subagent_type"],
        ),
    ),
    _tool(
        "Bash",
        "Executes a given bash command in a persistent shell session with optional timeout, ensuring proper "
        "handling and security measures.",
        _obj(
            {
                "command": _s("The command to execute"),
                "timeout": _n("Optional timeout in milliseconds (max 600000)"),
                "description": _s("Clear, concise description of what this command does in 5-10 words"),
                "run_in_background": _b("Set to true to run this command in the background."),
            },
            ["command"],
        ),
    ),
    _tool(
        "Glob",
        "Fast file pattern matching tool that works with any codebase size.",
        _obj(
            {
                "pattern": _s("The glob pattern to match files against"),
                "path": _s("The directory to search in. If not specified, the current working directory is used."),
            },
            ["pattern"],
        ),
    ),
    _tool(
        "Grep",
        "A powerful search tool built on ripgrep. Supports full regex syntax.",
        _obj(
            {
                "pattern": _s("The regular expression pattern to search for in file contents"),
                "path": _s("File or directory to search in. Defaults to current working directory."),
                "glob": _s('Glob pattern to filter files (e.g. "*.js", "*.{ts,tsx}")'),
                "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
                "-i": _b("Case insensitive search"),
                "-n": _b("Show line numbers in output"),
            },
            ["pattern"],
        ),
    ),
    _tool(
        "LS",
        "Lists files and directories in a given path. The path parameter must be an absolute path.",
        _obj(
            {
                "path": _s("The absolute path to the directory to list (must be absolute, not relative)"),
                "ignore": {"type": "array", "items": {"type": "string"}, "description": "List of glob patterns"},
            },
            ["path"],
        ),
    ),
    _tool(
        "ExitPlanMode",
        "Use this tool when you are in plan mode and have finished presenting your plan and are ready to code.",
        _obj({"plan": _s("The plan you came up with, that you want to run by the user for approval.")}, ["plan"]),
    ),
    _tool(
        "Read",
        "Reads a file from the local filesystem. The file_path parameter must be an absolute path.",
        _obj(
            {
                "file_path": _s("The absolute path to the file to read"),
                "offset": _n("The line number to start reading from"),
                "limit": _n("The number of lines to read"),
            },
            ["file_path"],
        ),
    ),
    _tool(
        "Edit",
        "Performs exact string replacements in files.",
        _obj(
            {
                "file_path": _s("The absolute path to the file to modify"),
                "old_string": _s("The text to replace"),
                "new_string": _s("The text to replace it with (must be different from old_string)"),
                "replace_all": _b("Replace all occurences of old_string (default false)"),
            },
            ["file_path", "old_string", "new_string"],
        ),
    ),
    _tool(
        "Write",
        "Writes a file to the local filesystem. This tool will overwrite the existing file if there is one.",
        _obj(
            {
                "file_path": _s("The absolute path to the file to write (must be absolute, not relative)"),
                "content": _s("The content to write to the file"),
            },
            ["file_path", "content"],
        ),
    ),
    _tool(
        "WebFetch",
        "Fetches content from a specified URL and processes it using an AI model.",
        _obj(
            {"url": _s("The URL to fetch content from"), "prompt": _s("The prompt to run on the fetched content")},
            ["url", "prompt"],
        ),
    ),
    _tool(
        "TodoWrite",
        "Use this tool to create and manage a structured task list for your current coding session.",
        _obj(
            {
                "todos": {
                    "type": "array",
                    "description": "The updated todo list",
                    "items": _obj(
                        {"content": _s("The task"), "status": _TODO_STATUS, "activeForm": _s("Present tense form")},
                        ["content", "status", "activeForm"],
                    ),
                }
            },
            ["todos"],
        ),
    ),
    _tool(
        "WebSearch",
        "Allows Claude to search the web and use the results to inform responses.",
        _obj({"query": _s("The search query to use")}, ["query"]),
    ),
    _tool(
        "BashOutput",
        "Retrieves output from a running or completed background bash shell.",
        _obj({"bash_id": _s("The ID of the background shell to retrieve output from")}, ["bash_id"]),
    ),
    _tool(
        "KillShell",
        "Kills a running background bash shell by its ID.",
        _obj({"shell_id": _s("The ID of the background shell to kill")}, ["shell_id"]),
    ),
]

CODEX_TOOLS = [
    _tool(
        "shell",
        "Runs a shell command and returns its output.",
        _obj(
            {
                "command": {"type": "array", "items": {"type": "string"}, "description": "The command to execute"},
                "workdir": _s("The working directory to execute the command in"),
                "timeout_ms": _n("The timeout for the command in milliseconds"),
            },
            ["command"],
        ),
    ),
    _tool(
        "apply_patch",
        "Use the `apply_patch` tool to edit files. The patch language is a stripped-down, file-oriented diff "
        "format: *** Begin Patch, then *** Add File / *** Update File / *** Delete File sections, *** End Patch.",
        _obj({"input": _s("The entire contents of the apply_patch command")}, ["input"]),
    ),
    _tool(
        "update_plan",
        "Updates the task plan. Provide an optional explanation and a list of plan items, each with a step and "
        "status. At most one step can be in_progress at a time.",
        _obj(
            {
                "explanation": {"type": "string"},
                "plan": {
                    "type": "array",
                    "description": "The list of steps",
                    "items": _obj({"step": {"type": "string"}, "status": _TODO_STATUS}, ["step", "status"]),
                },
            },
            ["plan"],
        ),
    ),
    _tool(
        "view_image",
        "Attach a local image (by filesystem path) to the conversation context for this turn.",
        _obj({"path": _s("Local filesystem path to an image file")}, ["path"]),
    ),
]

# Codex CLI since 0.1xx: a unified exec tool plus goal/stdin tools (the legacy set above is still served by
# older versions and other harnesses).
CODEX_EXEC_TOOLS = [
    _tool(
        "exec_command",
        "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
        _obj(
            {
                "cmd": _s("Shell command to execute."),
                "workdir": _s("Optional working directory to run the command in; defaults to the turn cwd."),
                "yield_time_ms": _n("How long to wait (in milliseconds) for output before yielding."),
                "max_output_tokens": _n("Maximum number of tokens to return. Excess output will be truncated."),
                "tty": _b("Whether to allocate a TTY for the command. Defaults to false."),
            },
            ["cmd"],
        ),
    ),
    _tool(
        "write_stdin",
        "Writes characters to an existing unified exec session and returns recent output.",
        _obj(
            {"session_id": _n("Identifier of the running unified exec session."), "chars": _s("Bytes to write.")},
            ["session_id"],
        ),
    ),
    _tool(
        "request_user_input",
        "Request user input for one to three short questions and wait for the response.",
        _obj({"questions": {"type": "array", "items": {"type": "string"}}}, ["questions"]),
    ),
    _tool(
        "view_image",
        "View a local image from the filesystem (only use if given a full filepath by the user).",
        _obj({"path": _s("Local filesystem path to an image file")}, ["path"]),
    ),
    _tool("get_goal", "Get the current goal of this thread, if any.", _obj({}, [])),
    _tool(
        "create_goal",
        "Create a goal for this thread when the user asks for a long-running objective.",
        _obj({"objective": _s("The objective."), "token_budget": {"type": "integer"}}, ["objective"]),
    ),
    _tool(
        "update_goal",
        "Update the status of the current goal: active, paused or complete.",
        _obj({"status": {"type": "string", "enum": ["active", "paused", "complete"]}}, ["status"]),
    ),
]

# Tools that newer agent versions list beside the ones above and that the chats never call.
EXTRA_TOOLS = {
    "opencode": [
        _tool(
            "skill",
            "Load a skill: a folder of instructions and scripts for a specialised task.",
            _obj({"name": _s("The name of the skill")}, ["name"]),
        ),
    ],
    "claude-code": [
        _tool(
            "Agent",
            "Launch a new agent to handle complex, multi-step tasks autonomously.",
            _obj(
                {"description": _s("A short description of the task"), "prompt": _s("The task for the agent")},
                ["description", "prompt"],
            ),
        ),
        _tool(
            "ToolSearch",
            "Search for deferred tools by keyword and load their schemas.",
            _obj({"query": _s("What to search for"), "max_results": _n("At most this many")}, ["query", "max_results"]),
        ),
        _tool(
            "Skill",
            "Execute a skill within the main conversation.",
            _obj({"skill": _s("The skill name"), "args": _s("Optional arguments")}, ["skill"]),
        ),
    ],
    "codex": [],
    "mini": [],
}

MINI_TOOLS = [
    _tool(
        "bash",
        "Execute a bash command",
        {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
            "required": ["command"],
        },
    ),
]

WORKFLOW_ACTIONS = ("list", "read", "search", "edit", "write", "run", "verify", "plan", "fetch", "delegate")
# Which tool each agent family uses for an abstract action; the first name present in a chat's set wins.
FAMILIES: dict[str, tuple[list[dict[str, Any]], dict[str, list[str]]]] = {
    "opencode": (
        OPENCODE_TOOLS,
        {
            "list": ["list", "bash"],
            "read": ["read", "bash"],
            "search": ["grep", "glob", "bash"],
            "edit": ["edit", "write", "bash"],
            "write": ["write", "bash"],
            "run": ["bash"],
            "verify": ["bash"],
            "plan": ["todowrite", "bash"],
            "fetch": ["webfetch", "bash"],
            "delegate": ["task", "bash"],
        },
    ),
    "claude-code": (
        CLAUDE_CODE_TOOLS,
        {
            "list": ["LS", "Bash"],
            "read": ["Read", "Bash"],
            "search": ["Grep", "Glob", "Bash"],
            "edit": ["Edit", "Write", "Bash"],
            "write": ["Write", "Bash"],
            "run": ["Bash"],
            "verify": ["Bash"],
            "plan": ["TodoWrite", "Bash"],
            "fetch": ["WebFetch", "Bash"],
            "delegate": ["Task", "Agent", "Bash"],
        },
    ),
    "codex": (
        CODEX_TOOLS,
        {
            "list": ["shell", "exec_command"],
            "read": ["shell", "exec_command"],
            "search": ["shell", "exec_command"],
            "edit": ["apply_patch", "shell", "exec_command"],
            "write": ["apply_patch", "shell", "exec_command"],
            "run": ["shell", "exec_command"],
            "verify": ["shell", "exec_command"],
            "plan": ["update_plan", "shell", "exec_command"],
            "fetch": ["shell", "exec_command"],
            "delegate": ["shell", "exec_command"],
        },
    ),
    "mini": (MINI_TOOLS, {action: ["bash"] for action in WORKFLOW_ACTIONS}),
}
CORE_TOOL = {"opencode": "bash", "claude-code": "Bash", "codex": "shell", "mini": "bash"}
"""Each family's shell tool: always listed (codex's current versions list ``exec_command`` instead)."""

WORKDIRS = ["/app", "/workspace", "/testbed", "/repo"]
PACKAGES = ["app", "calc", "src", "lib"]
MODULES = ["utils", "parser", "main", "models", "cli"]
FUNCS = ["parse_args", "compute_total", "load_config", "validate", "add", "main"]
TEST_CMDS = ["python -m pytest -q", "pytest -q", "pytest"]
MISC_CMDS = [
    "ls",
    "ls -la",
    "cat README.md",
    "echo hello",
    "git status",
    "git diff",
    "pwd",
    "python --version",
    "python main.py",
    "pip list",
]
ISSUES = ["an off-by-one error", "a missing import", "a wrong default value", "a typo in a variable name"]
USER_TASKS = [
    "Fix the failing test in {test}.",
    "The function {func} in {file} has a bug. Please fix it.",
    "Add a function {func} to {file} and a test for it.",
    "Run the test suite and tell me what fails.",
    "What does this repository do?",
    "Find where {func} is defined and explain it.",
    "Refactor {file} to remove duplicated code.",
    "Create a file hello.py that prints hello world, then run it.",
    "Make the tests pass.",
    "Update the README with usage instructions.",
    "There is {issue} in {file}. Fix it and run the tests.",
    "Implement the TODO in {file}.",
    "Check which Python version is installed and list the dependencies.",
    "Write a script that counts the lines in every .py file.",
    "Solve the task described in /app/instruction.md.",
    "Why does `{cmd}` fail? Investigate and fix it.",
]
FILE_NAMES = ["hello.txt", "notes.txt", "out.txt", "answer.txt", "data.csv", "todo.md", "greeting.txt"]
FILE_WORDS = ["hi", "hello", "done", "42", "ok", "yes", "world", "test"]
# Small shell chores: (task, [(command, output)], final answer); {name} and {word} are filled per chat.
SHELL_CHORES = [
    (
        "Create a file named {name} containing the word {word}. Use the shell.",
        [("echo {word} > {name}", ""), ("cat {name}", "{word}")],
        "Created {name} containing {word}.",
    ),
    (
        "Write {word} into {name}.",
        [("printf '{word}\\n' > {name}", "")],
        "Done: {name} holds {word}.",
    ),
    (
        "List the files in the current directory.",
        [("ls", "{name}\nREADME.md")],
        "The directory holds {name} and README.md.",
    ),
    (
        "Show the contents of {name}.",
        [("cat {name}", "{word}")],
        "{name} contains {word}.",
    ),
    (
        "Make a directory named out and put {name} with the word {word} in it.",
        [("mkdir -p out", ""), ("echo {word} > out/{name}", ""), ("ls out", "{name}")],
        "Created out/{name}.",
    ),
    (
        "Count the lines of {name}.",
        [("wc -l {name}", "1 {name}")],
        "{name} has 1 line.",
    ),
    (
        "Delete {name} if it exists, then confirm it is gone.",
        [("rm -f {name}", ""), ("ls", "README.md")],
        "Removed {name}.",
    ),
]
# What a coding chat does before its final, passing test run ("verify").
WORKFLOWS = [
    ["list", "read", "edit"],
    ["search", "read", "edit", "read"],
    ["run", "read", "edit"],
    ["list", "read"],
    ["read", "edit"],
    ["plan", "list", "read", "edit"],
    ["list", "write"],
    ["search", "read"],
    ["run"],
    ["list", "run", "read", "edit"],
    ["fetch", "read", "edit"],
    ["delegate", "read"],
    ["run", "read", "write"],
]
FINAL_ANSWERS = [
    "Done. I fixed {issue} in {file}, and the tests pass now.",
    "The tests pass: {n} passed.",
    "I updated {file}. All {n} tests pass.",
    "The repository contains a small Python package `{pkg}` with tests in `tests/`.",
    "`{func}` is defined in {file}; it returns the processed value.",
    "Done.",
    "Fixed. The bug was {issue} in `{func}`.",
    "I created the file and ran it; it prints the expected output.",
    "All done: the change is in {file} and the test suite is green.",
    "The command failed because of {issue}; I fixed it in {file}.",
]
PREFACES = [
    "I'll start by looking at the project.",
    "Let me check the files.",
    "Let me run the tests.",
    "I'll read the file first.",
    "Now I'll make the change.",
    "Let me verify the fix.",
]
GREETINGS = [
    ("hi", "Hello! How can I help you today?"),
    ("thanks!", "You're welcome!"),
    ("Hello, who are you?", "I am a coding assistant. Tell me what you need."),
    ("ok", "Let me know if you need anything else."),
    ("Are you there?", "Yes, I'm here."),
]


@dataclass(frozen=True)
class Project:
    """A made-up repository that tool arguments and results refer to."""

    workdir: str
    package: str
    module: str
    func: str
    issue: str
    n_tests: int

    @property
    def file(self) -> str:
        return f"{self.package}/{self.module}.py"

    @property
    def test(self) -> str:
        return f"tests/test_{self.module}.py"

    def abs(self, rel: str) -> str:
        return f"{self.workdir}/{rel}"


def _project(rng: random.Random, workdir: str) -> Project:
    return Project(
        workdir,
        rng.choice(PACKAGES),
        rng.choice(MODULES),
        rng.choice(FUNCS),
        rng.choice(ISSUES),
        rng.randint(1, 40),
    )


def _listing(p: Project) -> str:
    return "\n".join(["README.md", "pyproject.toml", f"{p.package}/", "tests/"])


def _source(p: Project, numbered: bool) -> str:
    lines = [
        f"def {p.func}(values):",
        "    total = 0",
        "    for v in values:",
        "        total += v",
        "    return total",
    ]
    if numbered:
        return "\n".join(f"{i + 1:5d}\t{line}" for i, line in enumerate(lines))
    return "\n".join(lines)


def _run_output(p: Project, rng: random.Random, cmd: str, passing: bool) -> str:
    if "test" in cmd:
        if passing:
            return f"{'.' * min(p.n_tests, 20)}\n{p.n_tests} passed in 0.{rng.randint(10, 99)}s"
        return f"F\nFAILED {p.test}::test_{p.func} - AssertionError\n1 failed, {p.n_tests} passed"
    if cmd.startswith("ls"):
        return _listing(p)
    if cmd.startswith("cat"):
        return _source(p, numbered=False)
    if cmd.startswith("echo"):
        return cmd[5:]
    if cmd == "pwd":
        return p.workdir
    if cmd.startswith("git status"):
        return f"On branch main\nChanges not staged for commit:\n\tmodified:   {p.file}"
    if "version" in cmd:
        return "Python 3.12.3"
    return rng.choice(["", "ok", "Hello, world!"])


def _coding_call(family: str, tool: str, action: str, p: Project, rng: random.Random) -> tuple[Args, str]:
    """Arguments for ``tool`` performing ``action`` on project ``p``, and the tool's result text.

    Each tool has one argument shape: its required keys.
    Tests fail when run by ``run`` and pass when run by ``verify``, the last action of every coding chat.
    """
    target = rng.choice([p.file, p.test, "README.md"])
    if tool in ("bash", "Bash", "shell", "exec_command"):
        cmd = {
            "list": "ls",
            "read": f"cat {target}",
            "search": f"grep -rn {p.func} .",
            "edit": f"sed -i 's/total = 0/total = 1/' {p.file}",
            "write": "echo 'print(1)' > hello.py",
            "run": rng.choice(TEST_CMDS + MISC_CMDS),
            "verify": rng.choice(TEST_CMDS),
            "plan": "git status",
            "fetch": "curl -s https://example.com",
            "delegate": rng.choice(TEST_CMDS),
        }[action]
        if action == "search":
            result = f"{p.file}:1:def {p.func}(values):"
        else:
            result = _run_output(p, rng, cmd, passing=action == "verify")
        return _shell_args(tool, cmd), result
    path_key = "filePath" if family == "opencode" else "file_path"
    old_key, new_key = ("oldString", "newString") if family == "opencode" else ("old_string", "new_string")
    if tool in ("list", "LS"):
        return {"path": p.workdir}, _listing(p)
    if tool in ("read", "Read"):
        return {path_key: p.abs(target)}, _source(p, numbered=True)
    if tool in ("grep", "Grep"):
        return {"pattern": p.func}, f"{p.abs(p.file)}:1:def {p.func}(values):"
    if tool in ("glob", "Glob"):
        return {"pattern": "**/*.py"}, f"{p.abs(p.file)}\n{p.abs(p.test)}"
    if tool in ("edit", "Edit"):
        args = {path_key: p.abs(p.file), old_key: "total = 0", new_key: "total = 1"}
        return args, "Edit applied successfully."
    if tool in ("write", "Write"):
        return {path_key: p.abs("hello.py"), "content": "print(1)\n"}, "Wrote file successfully."
    if tool == "apply_patch":
        patch = f"*** Begin Patch\n*** Update File: {p.file}\n@@\n-    total = 0\n+    total = 1\n*** End Patch"
        return {"input": patch}, "Success. Updated the following files:\nM " + p.file
    steps = [f"Fix {p.func}", "Run the tests"]
    if tool == "todowrite":
        todos = [
            {"content": s, "status": st, "priority": "high", "id": str(i + 1)}
            for i, (s, st) in enumerate(zip(steps, ["in_progress", "pending"], strict=True))
        ]
        return {"todos": todos}, json.dumps(todos)
    if tool == "TodoWrite":
        todos = [
            {"content": s, "status": st, "activeForm": s}
            for s, st in zip(steps, ["in_progress", "pending"], strict=True)
        ]
        return {"todos": todos}, "Todos have been modified successfully."
    if tool == "update_plan":
        return {"plan": [{"step": s, "status": "pending"} for s in steps]}, "Plan updated"
    if tool == "webfetch":
        return {"url": "https://docs.python.org/3/", "format": "markdown"}, "# Python documentation"
    if tool == "WebFetch":
        return {"url": "https://docs.python.org/3/", "prompt": "Summarise"}, "Python documentation."
    if tool in ("task", "Task", "Agent"):
        args = {"description": "Find the bug", "prompt": f"Find the bug in {p.func}.", "subagent_type": "general"}
        return args, f"The bug is {p.issue} in {p.file}."
    raise ValueError(f"no action {action!r} for tool {tool!r}")


@dataclass(frozen=True)
class GenericTool:
    """A generic function tool with a task phrase, an argument maker and a result maker."""

    schema: dict[str, Any]
    phrase: Callable[[Args], str]
    make_args: Callable[[random.Random], Args]
    result: Callable[[Args, random.Random], str]


def _arith(expression: str) -> int:
    a, op, b = expression.split()
    return {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}[op](int(a), int(b))


CITIES = ["Paris", "Tokyo", "Berlin", "Lima", "Oslo", "Cairo", "Sydney", "Toronto", "Madrid", "Seoul"]
TOPICS = ["python asyncio", "rust lifetimes", "the speed of light", "pytest fixtures", "GRPO", "docker compose"]
WORDS = ["hello", "banana", "ready", "42", "done", "test", "ping", "alpha"]

GENERIC_TOOLS = {
    "get_weather": GenericTool(
        _tool(
            "get_weather",
            "Get the current weather for a location.",
            _obj(
                {"location": _s("City name"), "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                ["location"],
            ),
        ),
        lambda a: f"check the weather in {a['location']}",
        lambda r: {"location": r.choice(CITIES)},
        lambda a, r: json.dumps({"temperature": r.randint(-5, 35), "condition": r.choice(["sunny", "cloudy", "rain"])}),
    ),
    "search": GenericTool(
        _tool(
            "search", "Search the web and return the top results.", _obj({"query": _s("The search query")}, ["query"])
        ),
        lambda a: f"search for {a['query']}",
        lambda r: {"query": r.choice(TOPICS)},
        lambda a, r: f"1. {a['query']} - overview\n2. {a['query']} tutorial",
    ),
    "calculator": GenericTool(
        _tool(
            "calculator",
            "Evaluate an arithmetic expression.",
            _obj({"expression": _s("The expression, e.g. 2 * (3 + 4)")}, ["expression"]),
        ),
        lambda a: f"compute {a['expression']}",
        lambda r: {"expression": f"{r.randint(2, 99)} {r.choice('+-*')} {r.randint(2, 99)}"},
        lambda a, r: str(_arith(a["expression"])),
    ),
    "echo": GenericTool(
        _tool("echo", "Echo the given text back.", _obj({"text": _s("Text to echo")}, ["text"])),
        lambda a: f"echo '{a['text']}'",
        lambda r: {"text": r.choice(WORDS)},
        lambda a, r: a["text"],
    ),
    "submit": GenericTool(
        _tool("submit", "Submit the final answer.", _obj({"answer": _s("The final answer")}, ["answer"])),
        lambda a: f"submit the answer {a['answer']}",
        lambda r: {"answer": r.choice(WORDS)},
        lambda a, r: "Submitted.",
    ),
    "get_time": GenericTool(
        _tool(
            "get_time",
            "Get the current time in a timezone.",
            _obj({"timezone": _s("IANA timezone name")}, ["timezone"]),
        ),
        lambda a: f"tell me the time in {a['timezone']}",
        lambda r: {"timezone": r.choice(["Europe/Paris", "Asia/Tokyo", "UTC", "America/New_York"])},
        lambda a, r: f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}",
    ),
    "translate": GenericTool(
        _tool(
            "translate",
            "Translate text into a target language.",
            _obj(
                {"text": _s("Text to translate"), "target_language": _s("Language code, e.g. fr")},
                ["text", "target_language"],
            ),
        ),
        lambda a: f"translate '{a['text']}' to {a['target_language']}",
        lambda r: {
            "text": r.choice(["good morning", "thank you", "where is the station"]),
            "target_language": r.choice(["fr", "de", "es", "ja"]),
        },
        lambda a, r: "bonjour" if a["target_language"] == "fr" else "ok",
    ),
    "read_file": GenericTool(
        _tool("read_file", "Read a text file.", _obj({"path": _s("Path to the file")}, ["path"])),
        lambda a: f"show me {a['path']}",
        lambda r: {"path": r.choice(["README.md", "notes.txt", "/etc/hostname", "config.yaml"])},
        lambda a, r: "# Notes\nremember the milk",
    ),
    "execute_bash": GenericTool(
        _tool(
            "execute_bash",
            "Execute a bash command in the terminal.",
            _obj({"command": _s("The bash command")}, ["command"]),
        ),
        lambda a: f"run `{a['command']}`",
        lambda r: {"command": r.choice(MISC_CMDS)},
        lambda a, r: "ok",
    ),
    "finish": GenericTool(
        _tool(
            "finish",
            "Signal that the task is complete.",
            _obj({"message": _s("Final message to the user")}, ["message"]),
        ),
        lambda a: "finish the task",
        lambda r: {"message": "Task complete."},
        lambda a, r: "Finished.",
    ),
}

AGENT_INTROS = {
    "opencode": (
        "You are opencode, an interactive CLI tool that helps users with software engineering tasks. "
        "Use the instructions below and the tools available to you to assist the user."
    ),
    "claude-code": (
        "You are Claude Code, Anthropic's official CLI for Claude. You are an interactive CLI tool that "
        "helps users with software engineering tasks."
    ),
    "codex": (
        "You are a coding agent running in the Codex CLI, a terminal-based coding assistant. You are expected "
        "to be precise, safe, and helpful."
    ),
    "mini": "You are a helpful assistant that can interact with a computer.",
    "generic": "You are a helpful assistant with access to tools.",
}
SECTION_TITLES = [
    "Tone and style",
    "Proactiveness",
    "Following conventions",
    "Code style",
    "Task management",
    "Doing tasks",
    "Tool usage policy",
    "Testing",
    "Git",
    "Security",
    "Planning",
    "Final answer",
]
FILLER = [
    "Be concise, direct, and to the point.",
    "Never add comments to code unless asked.",
    "Always run the tests after making a change.",
    "Prefer editing existing files over creating new ones.",
    "Do not commit changes unless the user explicitly asks you to.",
    "Use absolute paths when reading files.",
    "Keep your answers short: fewer than four lines unless the user asks for detail.",
    "When you are unsure, inspect the code before changing it.",
    "Follow the existing code style of the project.",
    "Never introduce code that exposes or logs secrets and keys.",
    "Check that a library is used before using it.",
    "Use the todo list to plan multi-step tasks.",
    "Batch independent tool calls together when possible.",
    "Refuse to write code that may be used maliciously.",
    "Do not use interactive commands such as git rebase -i.",
    "Quote file paths that contain spaces with double quotes.",
    "Avoid using cat, head and tail to read files.",
    "Explain non-trivial commands before you run them.",
    "Verify your solution with the project's test command.",
    "If a command fails, read the error message and try a different approach.",
    "Minimise output tokens while keeping quality and accuracy.",
    "Do not guess URLs; only use ones you are given.",
]


def system_prompt(rng: random.Random, family: str, workdir: str, target_chars: int) -> str:
    """An agent-style system prompt of about ``target_chars`` characters (intro, env block, filler sections)."""
    parts = [AGENT_INTROS[family]]
    if family not in ("generic", "mini"):
        parts.append(f"<env>\nWorking directory: {workdir}\nIs directory a git repo: yes\nPlatform: linux\n</env>")
    size = sum(len(x) for x in parts)
    while size < target_chars:
        section = [f"# {rng.choice(SECTION_TITLES)}"]
        section += [f"- {rng.choice(FILLER)}" for _ in range(rng.randint(2, 8))]
        text = "\n".join(section)
        parts.append(text)
        size += len(text) + 2
    return "\n\n".join(parts)


def _pick_tools(rng: random.Random, family: str) -> list[dict[str, Any]]:
    """The family's tools (core shell tool always kept), some generic ones, often verbose as real agents' are."""
    if family == "generic":
        names = rng.sample(sorted(GENERIC_TOOLS), rng.randint(1, 8))
        return [GENERIC_TOOLS[n].schema for n in names]
    if family == "mini":
        return copy.deepcopy(MINI_TOOLS)
    tools = FAMILIES[family][0]
    if family == "codex" and rng.random() < 0.6:
        tools = CODEX_EXEC_TOOLS
    core = {CORE_TOOL[family], "exec_command"}
    p_keep = rng.uniform(0.5, 1.0)
    keep = [t for t in tools + EXTRA_TOOLS[family] if t["function"]["name"] in core or rng.random() < p_keep]
    if rng.random() < 0.2:
        keep += [GENERIC_TOOLS[n].schema for n in rng.sample(sorted(GENERIC_TOOLS), rng.randint(1, 3))]
    if rng.random() < 0.5:
        rng.shuffle(keep)
    keep = copy.deepcopy(keep)
    if rng.random() < 0.3:  # real agents' tool descriptions run to thousands of characters
        for tool in keep:
            extra = [rng.choice(FILLER) for _ in range(rng.randint(2, 40))]
            tool["function"]["description"] += "\n\n" + "\n".join(f"- {line}" for line in extra)
    return keep


def _call(name: str, args: Args) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": args}}


def _system_chars(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.12:
        return 0
    if r < 0.5:
        return rng.randint(50, 600)
    if r < 0.8:
        return rng.randint(600, 4000)
    return rng.randint(4000, 24000)


@dataclass(frozen=True)
class Setting:
    """What chats in a group share: agent family, tool list (in order), system prompt, working directory."""

    family: str
    tools: list[dict[str, Any]]
    system: str | None
    workdir: str


FAMILY_NAMES = ["opencode", "claude-code", "codex", "mini", "generic"]


def _setting(rng: random.Random, system_chars: int | None, family: str | None = None) -> Setting:
    """A random setting. Agent families always get a system prompt (agents always send one)."""
    family = family or rng.choice(FAMILY_NAMES)
    workdir = rng.choice(WORKDIRS)
    tools = _pick_tools(rng, family)
    chars = _system_chars(rng) if system_chars is None else system_chars
    if family != "generic":
        chars = max(chars, 1)
    return Setting(family, tools, system_prompt(rng, family, workdir, chars) if chars else None, workdir)


def _actions(rng: random.Random) -> list[str]:
    """1-6 abstract actions (mostly 3 or more), ending in ``verify``: the final test run passes."""
    actions = list(rng.choice(WORKFLOWS))
    n_calls = rng.choices(range(1, 7), weights=[1, 2, 3, 3, 3, 3])[0]
    while len(actions) < n_calls - 1:
        actions.append(rng.choice(["read", "run", "edit", "search", "list"]))
    return [*actions[: n_calls - 1], "verify"]


def _shell_args(tool: str, cmd: str) -> Args:
    """A shell tool's required arguments only: the shape every agent accepts."""
    if tool == "shell":
        return {"command": ["bash", "-lc", cmd]}
    if tool == "exec_command":
        return {"cmd": cmd}
    return {"command": cmd}


def _chore_chat(rng: random.Random, setting: Setting, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A small shell chore done with the family's shell tool (the tool every agent family keeps)."""
    names = [t["function"]["name"] for t in setting.tools]
    tool = next(n for n in (CORE_TOOL[setting.family], "exec_command", "bash", "Bash", "shell") if n in names)
    task, steps, final = rng.choice(SHELL_CHORES)
    fill = {"name": rng.choice(FILE_NAMES), "word": rng.choice(FILE_WORDS)}
    messages.append({"role": "user", "content": task.format(**fill)})
    for cmd, output in steps:
        args = _shell_args(tool, cmd.format(**fill))
        messages.append({"role": "assistant", "content": "", "tool_calls": [_call(tool, args)]})
        messages.append({"role": "tool", "content": output.format(**fill)})
    messages.append({"role": "assistant", "content": final.format(**fill)})
    return {"messages": messages, "tools": copy.deepcopy(setting.tools)}


def _chat(rng: random.Random, setting: Setting) -> dict[str, Any]:
    project = _project(rng, setting.workdir)
    tools = copy.deepcopy(setting.tools)
    names = [t["function"]["name"] for t in tools]
    messages: list[dict[str, Any]] = [{"role": "system", "content": setting.system}] if setting.system else []
    if rng.random() < 0.03:
        user, answer = rng.choice(GREETINGS)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        return {"messages": messages, "tools": tools}
    if setting.family != "generic" and rng.random() < 0.35:
        return _chore_chat(rng, setting, messages)
    if setting.family == "generic":
        # 1-3 exchanges: each user request names one task, answered by one call and a short reply.
        for _ in range(rng.choices([1, 2, 3], weights=[3, 2, 1])[0]):
            name = rng.choice(names)
            args = GENERIC_TOOLS[name].make_args(rng)
            result = GENERIC_TOOLS[name].result(args, rng)
            messages += [
                {"role": "user", "content": GENERIC_TOOLS[name].phrase(args).capitalize() + "."},
                {"role": "assistant", "content": "", "tool_calls": [_call(name, args)]},
                {"role": "tool", "content": result},
                {"role": "assistant", "content": f"Done: {result.splitlines()[0][:40]}"},
            ]
        return {"messages": messages, "tools": tools}
    calls, results = [], []
    fill = {
        "test": project.test,
        "func": project.func,
        "file": project.file,
        "issue": project.issue,
        "cmd": rng.choice(TEST_CMDS),
        "n": project.n_tests,
        "pkg": project.package,
    }
    user = rng.choice(USER_TASKS).format(**fill)
    for action in _actions(rng):
        usable = [t for t in FAMILIES[setting.family][1][action] if t in names]
        # Prefer the family's core shell tool (always listed) for a good share of actions.
        tool = usable[0] if rng.random() < 0.6 else usable[-1]
        args, result = _coding_call(setting.family, tool, action, project, rng)
        calls.append((tool, args))
        results.append(result)
    final = rng.choice(FINAL_ANSWERS).format(**fill)
    if setting.family == "mini":  # mini-swe-agent wraps the task in its workflow instructions
        rules = "\n".join(f"- {rng.choice(FILLER)}" for _ in range(rng.randint(3, 30)))
        user = f"Please solve this issue: {user}\n\n## Recommended Workflow\n\n{rules}"
    messages.append({"role": "user", "content": user})
    for (name, args), result in zip(calls, results, strict=True):
        content = rng.choice(PREFACES) if rng.random() < 0.05 else ""
        messages.append({"role": "assistant", "content": content, "tool_calls": [_call(name, args)]})
        messages.append({"role": "tool", "content": result})
    messages.append({"role": "assistant", "content": final})
    return {"messages": messages, "tools": tools}


def synthetic_chats(n: int, seed: int, group_size: int = 1) -> list[dict[str, Any]]:
    """``n`` chats, deterministic in ``(n, seed, group_size)``.

    Each run of ``group_size`` consecutive chats (from the start) shares its system prompt and tool list;
    runs cycle through ``FAMILY_NAMES``, so that consecutive training steps alternate families rather than
    drift towards one family's tool names.
    """
    rng = random.Random(seed)
    chats: list[dict[str, Any]] = []
    while len(chats) < n:
        setting = _setting(rng, None, FAMILY_NAMES[len(chats) // group_size % len(FAMILY_NAMES)])
        chats += [_chat(rng, setting) for _ in range(group_size)]
    return chats[:n]


def heldout_prompts(n: int, seed: int, system_chars: int | None = None) -> list[dict[str, Any]]:
    """``n`` prompts (``messages``, ``tools``) that each end just before an assistant tool-call turn.

    Cut at the first such turn or a later one; ``system_chars`` fixes the system prompt length
    (0: none, except the short intro that agent families always get).
    """
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < n:
        chat = _chat(rng, _setting(rng, system_chars))
        cuts = [i for i, m in enumerate(chat["messages"]) if m["role"] == "assistant" and m.get("tool_calls")]
        if cuts:
            prompts.append({"messages": chat["messages"][: rng.choice(cuts)], "tools": chat["tools"]})
    return prompts
