"""The example black-box agent's tools: bad calls become error texts the model sees, never a crash."""

from __future__ import annotations

from pathlib import Path

from examples.agents.tool_agent import run_tool


def test_tools_answer_bad_calls_with_error_texts(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("the answer is 42")
    (work / "blob.bin").write_bytes(b"\xff\xfe\x00\x81")
    (tmp_path / "secret.txt").write_text("outside")
    assert run_tool("read_file", '{"path": "notes.txt"}', work) == ("the answer is 42", False)
    binary = run_tool("read_file", '{"path": "blob.bin"}', work)
    assert binary == ("error: cannot read blob.bin (UnicodeDecodeError)", False)
    assert run_tool("read_file", '{"path": "../secret.txt"}', work) == ("error: no such file secret.txt", False)
    assert run_tool("read_file", "[1]", work)[0].startswith("error: invalid arguments")
    assert run_tool("nope", "{}", work) == ("error: unknown tool nope", False)
    assert run_tool("submit", '{"answer": "42"}', work) == ("submitted", True)
    assert (work / "submission.txt").read_text() == "42"
