"""Loading Harbor task datasets into trainer rows: a local dataset dir, a single task, a Harbor registry dataset
(Harbor's own client on a local registry JSON, with tasks on disk and in a git repository), a Hub dataset repo
(``huggingface_hub`` against FakeHub on loopback), and the clear errors for everything that names no usable task."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from harness_grpo.harbor_tasks import TaskDatasetError, load_task_dataset
from tests.tasks.fake_hub import FakeHub

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "tasks"
EXAMPLE_NAMES = sorted(path.name for path in EXAMPLES.iterdir() if (path / "task.toml").is_file())


def _instruction(name: str) -> str:
    return (EXAMPLES / name / "instruction.md").read_text()


def test_a_local_dataset_dir_gives_one_row_per_task_in_name_order() -> None:
    rows = load_task_dataset(EXAMPLES)
    assert isinstance(rows, datasets.Dataset)
    assert rows.column_names == ["prompt", "task_name", "task_index", "task_path"]
    assert rows["task_name"] == EXAMPLE_NAMES
    assert rows["task_index"] == list(range(len(EXAMPLE_NAMES)))
    assert rows["task_path"] == [str(EXAMPLES / name) for name in EXAMPLE_NAMES]
    assert rows["prompt"] == [[{"role": "user", "content": _instruction(name)}] for name in EXAMPLE_NAMES]


def test_a_single_task_dir_gives_its_one_row(tmp_path: Path) -> None:
    rows = load_task_dataset(str(EXAMPLES / "roman-numerals")).to_list()
    assert rows == [
        {
            "prompt": [{"role": "user", "content": _instruction("roman-numerals")}],
            "task_name": "roman-numerals",
            "task_index": 0,
            "task_path": str(EXAMPLES / "roman-numerals"),
        }
    ]


def test_a_difficulty_keeps_the_tasks_whose_task_toml_names_it(tmp_path: Path) -> None:
    rows = load_task_dataset(EXAMPLES, difficulty="easy")
    easy = [name for name in EXAMPLE_NAMES if 'difficulty = "easy"' in (EXAMPLES / name / "task.toml").read_text()]
    assert rows["task_name"] == easy and len(easy) == 7
    assert rows["task_index"] == list(range(len(easy)))
    with pytest.raises(TaskDatasetError, match=r"no task of difficulty 'trivial'.*easy, hard, medium"):
        load_task_dataset(EXAMPLES, difficulty="trivial")


def test_subdirectories_without_task_toml_are_not_tasks(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES / "make-directory", tmp_path / "make-directory")
    (tmp_path / "notes").mkdir()
    (tmp_path / "README.md").write_text("two tasks would be listed here")
    assert load_task_dataset(tmp_path)["task_name"] == ["make-directory"]


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    """A Harbor registry JSON: `mini` 1.0 (one task in a git repository pinned by commit, one on disk) and 2.0."""
    repo = tmp_path / "task-repo"
    repo.mkdir()
    for name in ("roman-numerals", "sort-lines"):
        shutil.copytree(EXAMPLES / name, repo / name)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "tasks"]):
        subprocess.run([*git, *args], check=True, timeout=30)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    url = repo.as_uri()
    datasets_json = [
        {
            "name": "mini",
            "version": "1.0",
            "description": "two tasks",
            "tasks": [
                {"name": "roman-numerals", "git_url": url, "git_commit_id": commit, "path": "roman-numerals"},
                {"name": "create-hello-file", "path": str(EXAMPLES / "create-hello-file")},
            ],
        },
        {
            "name": "mini",
            "version": "2.0",
            "description": "one task",
            "tasks": [{"name": "s", "git_url": url, "path": "sort-lines"}],
        },
    ]
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(datasets_json))
    return path


def test_a_registry_dataset_at_a_version_is_downloaded_by_harbor(registry: Path, tmp_path: Path) -> None:
    rows = load_task_dataset("mini@1.0", registry_path=registry, download_dir=tmp_path / "downloads").to_list()
    assert [row["task_name"] for row in rows] == ["roman-numerals", "create-hello-file"]
    assert [row["task_index"] for row in rows] == [0, 1]
    assert [row["prompt"][0]["content"] for row in rows] == [
        _instruction("roman-numerals"),
        _instruction("create-hello-file"),
    ]
    downloaded = Path(rows[0]["task_path"])
    assert downloaded.is_relative_to(tmp_path / "downloads")
    assert (downloaded / "solution" / "solve.sh").read_text() == (
        EXAMPLES / "roman-numerals" / "solution" / "solve.sh"
    ).read_text()
    assert not list(downloaded.rglob(".git")), "a downloaded task carries no repository history"
    assert rows[1]["task_path"] == str(EXAMPLES / "create-hello-file")


def test_a_registry_dataset_without_a_version_resolves_to_the_latest(registry: Path, tmp_path: Path) -> None:
    rows = load_task_dataset("mini", registry_path=registry, download_dir=tmp_path / "downloads")
    assert rows["task_name"] == ["sort-lines"]


@pytest.mark.parametrize(
    ("source", "message"),
    [("unknown-set", "Dataset unknown-set not found"), ("mini@9.9", "Version 9.9 of dataset mini not found")],
)
def test_an_unknown_registry_dataset_or_version_is_a_clear_error(registry: Path, source: str, message: str) -> None:
    with pytest.raises(TaskDatasetError, match=rf"'{source}' is not a local directory.*{message}"):
        load_task_dataset(source, registry_path=registry)


def test_a_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TaskDatasetError, match="No such task directory"):
        load_task_dataset(tmp_path / "absent")
    with pytest.raises(TaskDatasetError, match="No such task directory"):
        load_task_dataset("./absent-dir")


def test_a_dir_with_no_task_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskDatasetError, match=r"not a Harbor task directory \(no task.toml\)"):
        load_task_dataset(tmp_path / "empty")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(TaskDatasetError, match="is not a directory of Harbor tasks"):
        load_task_dataset(tmp_path / "file.txt")


def test_a_task_without_instruction_md_is_a_clear_error(tmp_path: Path) -> None:
    task = tmp_path / "tasks" / "append-line"
    shutil.copytree(EXAMPLES / "append-line", task)
    (task / "instruction.md").unlink()
    with pytest.raises(TaskDatasetError, match=r"append-line is not a valid Harbor task: .*missing instruction\.md"):
        load_task_dataset(tmp_path / "tasks")


def test_a_task_with_an_invalid_task_toml_is_a_clear_error(tmp_path: Path) -> None:
    task = tmp_path / "append-line"
    shutil.copytree(EXAMPLES / "append-line", task)
    (task / "task.toml").write_text('[agent]\ntimeout_sec = "soon"\n')
    with pytest.raises(TaskDatasetError, match=r"(?s)append-line is not a valid Harbor task: .*agent.timeout_sec"):
        load_task_dataset(task)


def test_a_hub_dataset_needs_owner_and_name() -> None:
    with pytest.raises(TaskDatasetError, match=r"hf://owner/name\[/sub/dir\]\[@revision\], got 'tasks'"):
        load_task_dataset("hf://tasks")


def _load_in_child(source: str, hub_endpoint: str, home: Path) -> str:
    """load_task_dataset(source) in a fresh Python (the Hub endpoint is read at import): its rows as JSON, or its
    TaskDatasetError's message."""
    script = (
        "import json, sys\n"
        "from harness_grpo.harbor_tasks import TaskDatasetError, load_task_dataset\n"
        "try:\n    print(json.dumps(load_task_dataset(sys.argv[1]).to_list()))\n"
        "except TaskDatasetError as error:\n    print(error)\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": str(home),
        "HF_HOME": str(home / "hf"),
        "HF_ENDPOINT": hub_endpoint,
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    done = subprocess.run([sys.executable, "-c", script, source], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_hub_dataset_repo_is_downloaded_as_real_files_and_read_like_a_local_dir(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("roman-numerals", "make-directory"):
        shutil.copytree(EXAMPLES / name, repo / "tasks" / name)
    (repo / "README.md").write_text("Agent tasks.")
    with FakeHub("someone/agent-tasks", repo) as hub:
        rows = json.loads(_load_in_child("hf://someone/agent-tasks/tasks", hub.url, tmp_path / "home"))
        single = json.loads(
            _load_in_child("hf://someone/agent-tasks/tasks/roman-numerals@main", hub.url, tmp_path / "home")
        )
    downloaded = tmp_path / "home" / ".cache" / "harbor" / "tasks" / "hf" / "someone" / "agent-tasks" / "main" / "tasks"
    assert [(row["task_name"], row["task_index"], row["task_path"]) for row in rows] == [
        ("make-directory", 0, str(downloaded / "make-directory")),
        ("roman-numerals", 1, str(downloaded / "roman-numerals")),
    ]
    assert rows[1]["prompt"] == [{"role": "user", "content": _instruction("roman-numerals")}]
    assert [row["task_name"] for row in single] == ["roman-numerals"]
    check = downloaded / "roman-numerals" / "tests" / "check.py"
    assert (
        not check.is_symlink() and check.read_text() == (EXAMPLES / "roman-numerals" / "tests" / "check.py").read_text()
    )


def test_a_hub_dataset_without_network_is_a_clear_error(tmp_path: Path) -> None:
    """The Hub endpoint is a closed loopback port and nothing is cached: what a machine without network sees."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    message = _load_in_child("hf://someone/agent-tasks", f"http://127.0.0.1:{closed_port}", tmp_path / "home")
    assert "Cannot download Hub dataset 'someone/agent-tasks': the Hub is unreachable" in message
