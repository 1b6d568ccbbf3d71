"""Harbor task datasets as trainer rows.

``load_task_dataset(source)`` turns a dataset of Harbor tasks into a ``datasets.Dataset`` with one row per task,
in the shape of OpenEnv's ``HarborSessionFactory`` rows plus the task's local directory::

    {"prompt": [{"role": "user", "content": <instruction.md text>}], "task_name": str, "task_index": int,
     "task_path": str}

``source`` is one of:

- a local directory: a single task (it holds ``task.toml``) or a dataset whose subdirectories are tasks
  (those holding ``task.toml``, in name order);
- ``hf://owner/name[/sub/dir][@revision]``: a Hugging Face Hub *dataset* repo of task directories, downloaded
  with ``huggingface_hub.snapshot_download(repo_type="dataset")`` into ``download_dir`` (default: Harbor's task
  cache, ``~/.cache/harbor/tasks/hf``) and then read as a local directory;
- a Harbor dataset name, ``name`` or ``name@version`` (``org/name[@ref]`` for Harbor Hub packages), resolved and
  downloaded by Harbor's own dataset client: the default Harbor registry, or the registry JSON at
  ``registry_path`` / ``registry_url``.

Every task is parsed by Harbor's own ``Task`` loader, so a row exists only for a task a Harbor trial can run.
``difficulty`` keeps the tasks whose ``task.toml`` says ``[metadata] difficulty = "<difficulty>"``. Anything
else is a ``TaskDatasetError`` that names the source and what is wrong with it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import datasets
from harbor.constants import TASK_CACHE_DIR
from harbor.models.job.config import DatasetConfig
from harbor.models.task.paths import TaskPaths
from harbor.models.task.task import Task
from harbor.tasks.client import TaskClient

HUB_PREFIX = "hf://"


class TaskDatasetError(ValueError):
    """A dataset source that names no usable Harbor tasks, or a task in it that Harbor cannot load."""


def load_task_dataset(
    source: str | Path,
    *,
    registry_path: Path | None = None,
    registry_url: str | None = None,
    download_dir: Path | None = None,
    difficulty: str | None = None,
) -> datasets.Dataset:
    """One row per task of ``source`` (see the module docstring), only those of ``difficulty`` if given;
    downloads go to ``download_dir`` if given.

    Harbor downloads are asynchronous underneath, so call this outside a running event loop.
    """
    task_dirs = resolve_task_dirs(source, registry_path, registry_url, download_dir)
    if difficulty is not None:
        found = {task_dir: _load_task(task_dir).config.metadata.get("difficulty") for task_dir in task_dirs}
        task_dirs = [task_dir for task_dir in task_dirs if found[task_dir] == difficulty]
        if not task_dirs:
            known = sorted({str(level) for level in found.values() if level is not None})
            raise TaskDatasetError(
                f"{source} has no task of difficulty {difficulty!r} (its tasks say: {', '.join(known) or 'none'})"
            )
    return datasets.Dataset.from_list(task_rows(task_dirs))


def resolve_task_dirs(
    source: str | Path,
    registry_path: Path | None = None,
    registry_url: str | None = None,
    download_dir: Path | None = None,
) -> list[Path]:
    """The local task directories ``source`` names, downloading them first when they are remote."""
    if isinstance(source, str) and source.startswith(HUB_PREFIX):
        return local_task_dirs(_download_hub_dataset(source[len(HUB_PREFIX) :], download_dir))
    path = Path(source).expanduser()
    if path.exists():
        return local_task_dirs(path)
    if isinstance(source, Path) or source.startswith((".", "/", "~")):
        raise TaskDatasetError(f"No such task directory: {path}")
    return asyncio.run(_download_harbor_dataset(source, registry_path, registry_url, download_dir))


def local_task_dirs(path: Path) -> list[Path]:
    """``path`` itself when it is a task directory, else its task subdirectories in name order."""
    if not path.is_dir():
        raise TaskDatasetError(f"{path} is not a directory of Harbor tasks")
    if TaskPaths(path).config_path.is_file():
        return [path.resolve()]
    tasks = sorted(child.resolve() for child in path.iterdir() if TaskPaths(child).config_path.is_file())
    if not tasks:
        raise TaskDatasetError(f"{path} is not a Harbor task directory (no task.toml) and no subdirectory of it is")
    return tasks


def task_rows(task_dirs: list[Path]) -> list[dict[str, Any]]:
    """Trainer rows for ``task_dirs``, in order; each task is parsed by Harbor's ``Task``."""
    rows = []
    for index, task_dir in enumerate(task_dirs):
        task = _load_task(task_dir)
        rows.append(
            {
                "prompt": [{"role": "user", "content": task.instruction}],
                "task_name": task.name,
                "task_index": index,
                "task_path": str(task.task_dir),
            }
        )
    return rows


def _load_task(task_dir: Path) -> Task:
    try:
        task = Task(task_dir)
    except (OSError, ValueError) as error:
        raise TaskDatasetError(f"{task_dir} is not a valid Harbor task: {error}") from error
    if task.has_steps:
        raise TaskDatasetError(f"{task_dir} is a multi-step Harbor task; only single-instruction tasks make rows")
    if not task.instruction.strip():
        raise TaskDatasetError(f"{task_dir} has an empty instruction.md")
    return task


def _download_hub_dataset(spec: str, download_dir: Path | None) -> Path:
    """``owner/name[/sub/dir][@revision]`` of a Hub dataset repo, downloaded; the directory it names."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    spec, _, revision = spec.partition("@")
    parts = [part for part in spec.split("/") if part]
    if len(parts) < 2:
        raise TaskDatasetError(f"Hub dataset must be {HUB_PREFIX}owner/name[/sub/dir][@revision], got {spec!r}")
    repo_id, subdir = "/".join(parts[:2]), "/".join(parts[2:])
    # Real files, not the Hub cache's symlinks into its blob store: Harbor refuses task files that lead outside.
    local_dir = (download_dir or TASK_CACHE_DIR / "hf") / repo_id / (revision or "main")
    try:
        root = snapshot_download(
            repo_id,
            repo_type="dataset",
            revision=revision or None,
            local_dir=local_dir,
            allow_patterns=f"{subdir}/**" if subdir else None,
        )
    except LocalEntryNotFoundError as error:
        raise TaskDatasetError(
            f"Cannot download Hub dataset {repo_id!r}: the Hub is unreachable (no network, or HF_HUB_OFFLINE=1) "
            f"and no copy is cached. {error}"
        ) from error
    except HfHubHTTPError as error:
        raise TaskDatasetError(f"Cannot download Hub dataset {repo_id!r}: {error}") from error
    return Path(root) / subdir


async def _download_harbor_dataset(
    source: str, registry_path: Path | None, registry_url: str | None, download_dir: Path | None
) -> list[Path]:
    """Harbor resolves ``name[@version]`` to task ids and downloads them; their local directories, in its order."""
    name, _, version = source.partition("@")
    # Harbor's own rule: a name with a slash is a Harbor Hub package (pinned by ref), else a registry dataset.
    pin = {"ref": version} if "/" in name else {"version": version}
    try:
        config = DatasetConfig(
            name=name,
            **(pin if version else {}),
            registry_path=registry_path,
            registry_url=registry_url,
            download_dir=download_dir,
        )
        task_ids = [task.get_task_id() for task in await config.get_task_configs()]
        downloads = await TaskClient().download_tasks(task_ids, output_dir=download_dir)
    except Exception as error:
        where = registry_path or registry_url or "the default Harbor registry"
        raise TaskDatasetError(
            f"{source!r} is not a local directory and Harbor could not resolve it as a dataset in {where}: "
            f"{type(error).__name__}: {error}"
        ) from error
    if not task_ids:
        raise TaskDatasetError(f"Harbor dataset {name!r} has no tasks")
    return [Path(path) for path in downloads.paths]
