"""A training run as a Hugging Face Job: its specification, and its submission through ``huggingface_hub``.

``job_spec(...)`` builds a ``JobSpec``: the arguments of ``HfApi.run_job`` (image, command, environment, secret
names, flavor, timeout, volumes, name, namespace). The job's command is one ``bash -c`` script
(``bootstrap_script``): fetch this repository (``git clone`` of ``source`` at ``revision``, or ``cd`` into a path
the job already has: a mounted volume or the image), install it (``install``; default: a uv virtualenv with the
``vllm`` and ``e2b`` extras, transformers overridden to ours, since vLLM's pin is older), then ``exec python
launchers/job_entry.py <entry flags> -- <train flags>`` (``harness_grpo.job_processes``: vLLM on GPU 0, the trainer
on the others, the rollout side, template warm-up, every child killed on exit).

Secrets are names (``HF_TOKEN``, ``E2B_API_KEY``): their values are read from the submitting machine's environment
(``HF_TOKEN`` also from the saved login) only when the job is submitted (``JobSpec.run_job_kwargs``), never printed.
``submit(spec, api)`` calls ``api.run_job(**spec.run_job_kwargs())``; point ``HfApi(endpoint=...)`` (or
``HF_ENDPOINT``) elsewhere to submit to another Jobs API.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, JobInfo, Volume, get_token
from huggingface_hub.utils import parse_hf_mount

REPO = Path(__file__).resolve().parents[1]
DEFAULT_IMAGE = "ghcr.io/astral-sh/uv:python3.12-bookworm"
"""``huggingface_hub``'s own image for uv jobs: Python 3.12, uv and git."""
CHECKOUT = "/harness-grpo"
DEFAULT_INSTALL = (
    "uv venv --python 3.12 /tmp/venv && . /tmp/venv/bin/activate && "
    "printf 'transformers>=5.2,<6\\n' > /tmp/overrides.txt && "
    "uv pip install --override /tmp/overrides.txt -e '.[vllm,e2b]'"
)
"""Install the checkout with vLLM; transformers is overridden to ours (vLLM's pin is older: REFERENCE §1.1)."""
SANDBOX_SECRETS = {"e2b": ("E2B_API_KEY",)}
"""Secrets a sandbox needs, added when the train flags name it with ``--sandbox``."""


class JobSpecError(ValueError):
    """The job cannot be specified or submitted as asked; says what to change."""


@dataclass
class JobSpec:
    """The arguments of ``HfApi.run_job`` for one run, secrets by name (module docstring)."""

    image: str
    command: list[str]
    flavor: str
    timeout: str
    env: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    name: str = "harness-grpo"
    namespace: str | None = None

    def to_json(self) -> str:
        """What ``--dry-run`` prints: every field, secrets as names."""
        return json.dumps(asdict(self), indent=2)

    def run_job_kwargs(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """``HfApi.run_job``'s keyword arguments, secret values read from ``environ`` (default ``os.environ``);
        ``JobSpecError`` naming every secret without a value."""
        volumes = [volume(spec) for spec in self.volumes] or None
        return {
            "image": self.image,
            "command": list(self.command),
            "env": dict(self.env),
            "secrets": secret_values(self.secrets, os.environ if environ is None else environ),
            "flavor": self.flavor,
            "timeout": self.timeout,
            "volumes": volumes,
            "name": self.name,
            "namespace": self.namespace,
        }


def secret_values(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Each secret's value from ``environ`` (``HF_TOKEN``: or the saved login); ``JobSpecError`` for missing ones."""
    values, missing = {}, []
    for name in names:
        value = environ.get(name) or (get_token() if name == "HF_TOKEN" else None)
        if value:
            values[name] = value
        else:
            missing.append(name)
    if missing:
        raise JobSpecError(
            f"no value for the secret(s) {', '.join(missing)}: set them in this shell's environment "
            "(HF_TOKEN: or run `hf auth login`)"
        )
    return values


def volume(spec: str) -> Volume:
    """A ``hf://[TYPE/]SOURCE[/PATH]:/MOUNT_PATH[:ro|:rw]`` mount (as ``hf jobs --volume``) as a ``Volume``."""
    try:
        mount = parse_hf_mount(spec)
    except ValueError as error:
        raise JobSpecError(f"--volume {spec!r}: {error}") from error
    return Volume(
        type=mount.source.type,
        source=mount.source.id,
        mount_path=mount.mount_path,
        read_only=mount.read_only,
        path=mount.source.path_in_repo or None,
        revision=mount.source.revision or None,
    )


def gpu_count(flavor: str) -> int:
    """GPUs of a Jobs flavor: ``cpu-*`` none, ``...xN`` N (``h200x2``, ``a10g-largex4``, ``l4x1``), else one."""
    if flavor.startswith("cpu"):
        return 0
    match = re.search(r"x(\d+)$", flavor)
    return int(match.group(1)) if match else 1


def local_source(repo: Path = REPO) -> tuple[str, str]:
    """This checkout's ``origin`` URL and ``HEAD`` commit; ``JobSpecError`` when it has no origin."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise JobSpecError(
                f"cannot tell where the job gets this code (git {' '.join(args)}: {done.stderr.strip()}): "
                "pass --source (a git URL the job can clone, or a path inside the job) and --revision"
            )
        return done.stdout.strip()

    return git("remote", "get-url", "origin"), git("rev-parse", "HEAD")


def bootstrap_script(source: str, revision: str | None, install: str, entry_argv: Sequence[str]) -> str:
    """The job's shell script: fetch (``source`` a git URL) or enter (a path in the job) the code, install it, and
    ``exec`` the in-job entry with ``entry_argv``."""
    if source.startswith("/"):
        fetch = f"cd {shlex.quote(source)}"
    else:
        fetch = f"git clone --quiet {shlex.quote(source)} {CHECKOUT} && cd {CHECKOUT}"
        if revision:
            fetch += f" && git checkout --quiet {shlex.quote(revision)}"
    steps = ["set -euo pipefail", fetch]
    if install:
        steps.append(install)
    steps.append("exec python " + shlex.join(["launchers/job_entry.py", *entry_argv]))
    return "\n".join(steps)


def _flag(flags: Sequence[str], name: str) -> str | None:
    """The value of ``--name`` among ``flags`` (``--name v`` or ``--name=v``), the last one given."""
    value = None
    for i, flag in enumerate(flags):
        if flag == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif flag.startswith(name + "="):
            value = flag.split("=", 1)[1]
    return value


def job_spec(
    train_flags: Sequence[str],
    *,
    flavor: str = "h200x2",
    image: str = DEFAULT_IMAGE,
    secrets: Sequence[str] = ("HF_TOKEN",),
    timeout: str = "2h",
    volumes: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    namespace: str | None = None,
    name: str = "harness-grpo",
    source: str | None = None,
    revision: str | None = None,
    install: str = DEFAULT_INSTALL,
    engine: str | None = None,
    hub_model_id: str | None = None,
    entry_flags: Sequence[str] = (),
) -> JobSpec:
    """The job that runs ``launchers/train.py <train_flags>`` on ``flavor`` (module docstring).

    ``engine``: ``vllm`` (default on GPU flavors: GPU 0 serves, the others train) or ``embedded`` (default on CPU
    flavors). ``hub_model_id`` adds ``--push_to_hub true --hub_model_id ...`` (checkpoints and the final model go to
    the Hub). ``source``/``revision`` default to this checkout's origin and HEAD. ``entry_flags`` go to
    ``launchers/job_entry.py`` as they are. ``JobSpecError`` for what cannot run.
    """
    train_flags = list(train_flags)
    for spec in volumes:
        volume(spec)
    if _flag(train_flags, "--model") is None:
        raise JobSpecError("the training flags must name the policy: -- --model <hub id> ...")
    gpus = gpu_count(flavor)
    engine = engine or ("vllm" if gpus else "embedded")
    if engine == "vllm" and gpus < 2:
        raise JobSpecError(
            f"flavor {flavor} has {gpus} GPU(s); vLLM and the trainer need one each for the NCCL weight sync "
            "(e.g. --flavor h200x2), or run the embedded engine (--engine embedded)"
        )
    if hub_model_id:
        train_flags += ["--push_to_hub", "true", "--hub_model_id", hub_model_id]
    secrets = list(dict.fromkeys([*secrets, *SANDBOX_SECRETS.get(_flag(train_flags, "--sandbox") or "", ())]))
    if "--push_to_hub" in train_flags and "HF_TOKEN" not in secrets:
        secrets.append("HF_TOKEN")
    if source is None:
        source, local_revision = local_source()
        revision = revision or local_revision
    entry = ["--engine", engine]
    if engine == "vllm":
        entry += ["--engine_gpus", "0", "--trainer_gpus", ",".join(str(gpu) for gpu in range(1, gpus))]
    else:
        entry += ["--engine_gpus", "", "--trainer_gpus", ",".join(str(gpu) for gpu in range(gpus))]
    entry_argv = [*entry, *entry_flags, "--", *train_flags]
    return JobSpec(
        image=image,
        command=["bash", "-c", bootstrap_script(source, revision, install, entry_argv)],
        flavor=flavor,
        timeout=timeout,
        env={"PYTHONUNBUFFERED": "1", **dict(env or {})},
        secrets=secrets,
        volumes=list(volumes),
        name=name,
        namespace=namespace,
    )


def submit(spec: JobSpec, api: HfApi | None = None, environ: Mapping[str, str] | None = None) -> JobInfo:
    """Submit ``spec`` through ``api.run_job`` (default ``HfApi()``); the created job."""
    return (api or HfApi()).run_job(**spec.run_job_kwargs(environ))
