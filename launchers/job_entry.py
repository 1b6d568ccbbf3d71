"""Inside a Hugging Face Job: run the engine, the rollout side and the trainer; stop them all when it ends.

    python launchers/job_entry.py [--engine vllm|embedded] [--engine_gpus 0] [--trainer_gpus 1] \
        [--rollout_command "openenv harbor serve ..." --rollout_health_url http://127.0.0.1:8200/health] \
        [--warm_templates auto|yes|no] [--tool_call_parser hermes] -- <launchers/train.py flags, --model required>

``launchers/hf_jobs.py`` submits a job whose command ends with this. What runs where, the health waits, the
template warm-up and the clean-up are ``harness_grpo.job_processes``'s; the exit status is the trainer's (1 when a
child failed first). Each child's output is in ``--log_dir`` (default ``job-logs/``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness_grpo.job_processes import main_for, plan_from_args

if __name__ == "__main__":
    sys.exit(main_for(plan_from_args(sys.argv[1:])))
