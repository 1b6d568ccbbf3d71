"""Submit a training run to Hugging Face Jobs (``huggingface_hub``'s jobs API).

    python launchers/hf_jobs.py --flavor h200x2 --secrets HF_TOKEN --secrets E2B_API_KEY --timeout 2h \
        --hub_model_id me/qwen3-opencode -- \
        --model Qwen/Qwen3-0.6B --harness opencode --sandbox e2b --proxy_url https://... --max_steps 200
    python launchers/hf_jobs.py --dry-run -- --model Qwen/Qwen3-0.6B   # print the job specification, send nothing

Everything after ``--`` goes to ``launchers/train.py`` inside the job. The job clones this repository's ``origin`` at
this checkout's ``HEAD`` (``--source``/``--revision`` to change it; push first), installs it with vLLM
(``--install``), and runs ``launchers/job_entry.py``: vLLM on GPU 0, the trainer on the other GPUs, the rollout
side, the sandbox template warm-up, every child process group killed when the job ends. ``--hub_model_id`` pushes
checkpoints and the final model to the Hub; ``--volume hf://buckets/me/runs:/runs`` mounts a bucket (then e.g.
``-- --output_dir /runs/run1``). Secrets are names; their values come from this shell's environment when the job is
submitted and are never printed. The API endpoint is ``HF_ENDPOINT``'s (default the Hub).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness_grpo.hf_jobs import DEFAULT_IMAGE, DEFAULT_INSTALL, JobSpecError, job_spec, submit


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's flags (before ``--``) and the training flags (after it)."""
    own, train_flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="launchers/hf_jobs.py", description=__doc__.split("\n")[0])
    parser.add_argument("--flavor", default="h200x2", help="Jobs hardware (hf jobs hardware); GPU 0 serves vLLM")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="Docker image with bash, git and uv")
    parser.add_argument("--secrets", action="append", default=[], help="secret name, value from this shell (repeat)")
    parser.add_argument("--timeout", default="2h", help="the job's limit: 7200, 7200s, 120m, 2h")
    parser.add_argument("-v", "--volume", action="append", default=[], help="hf://[TYPE/]SOURCE[/PATH]:/MOUNT[:ro]")
    parser.add_argument("-e", "--env", action="append", default=[], help="KEY=VALUE for the job (repeatable)")
    parser.add_argument("--namespace", default=None, help="user or organization running the job (default: yours)")
    parser.add_argument("--name", default="harness-grpo", help="the job's name label")
    parser.add_argument("--source", default=None, help="git URL the job clones, or a path in the job (default: origin)")
    parser.add_argument("--revision", default=None, help="commit, branch or tag to run (default: this HEAD)")
    parser.add_argument("--install", default=DEFAULT_INSTALL, help="shell command installing the checkout ('' none)")
    parser.add_argument("--engine", choices=("vllm", "embedded"), default=None, help="default: vllm on GPU flavors")
    parser.add_argument("--hub_model_id", default=None, help="push checkpoints and the final model to this repo")
    parser.add_argument("--entry_arg", action="append", default=[], help="one more launchers/job_entry.py flag")
    parser.add_argument("--dry-run", action="store_true", help="print the job specification as JSON; submit nothing")
    args = parser.parse_args(own)
    bad = [item for item in args.env if "=" not in item]
    if bad:
        parser.error(f"--env takes KEY=VALUE, not {', '.join(bad)}")
    return args, train_flags


def main(argv: list[str] | None = None) -> int:
    args, train_flags = parse(list(sys.argv[1:] if argv is None else argv))
    try:
        spec = job_spec(
            train_flags,
            flavor=args.flavor,
            image=args.image,
            secrets=args.secrets or ["HF_TOKEN"],
            timeout=args.timeout,
            volumes=args.volume,
            env=dict(item.split("=", 1) for item in args.env),
            namespace=args.namespace,
            name=args.name,
            source=args.source,
            revision=args.revision,
            install=args.install,
            engine=args.engine,
            hub_model_id=args.hub_model_id,
            entry_flags=args.entry_arg,
        )
        if args.dry_run:
            print(spec.to_json())
            return 0
        job = submit(spec)
    except JobSpecError as error:
        print(f"cannot submit: {error}", file=sys.stderr)
        return 2
    print(f"job {job.id} submitted: {job.url}")
    print(f"follow it with: hf jobs logs {job.id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
