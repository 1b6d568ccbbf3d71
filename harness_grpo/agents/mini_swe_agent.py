"""mini-swe-agent: the ``mini`` CLI, non-interactive (``-y --exit-immediately``), chat completions.

Its model is ``ProxyChatModel`` (``mini_swe_agent_model.py``, written into ``home`` and named with
``model.model_class``): mini's own requests-based model pointed at ``OPENAI_API_BASE`` = ``<proxy>/v1``,
instead of its LiteLLM default, whose import alone costs about 10 s of CPU per run. The global config
dir is under ``home`` and ``MSWEA_CONFIGURED`` skips the first-run wizard; cost tracking ignores the
unknown model. ``agent.step_limit`` bounds its loop. The trajectory goes to ``home/mini.traj.json``
(output ``trajectory``). A system prompt replaces both its templates (system, and the workflow rules
around the task).
"""

from __future__ import annotations

import json
from pathlib import Path

from harness_grpo.agents.spec import AgentCommand, AgentLaunch, AgentSpec, Install

MODEL_MODULE = "harness_mini_model"
MODEL_SOURCE = Path(__file__).with_name("mini_swe_agent_model.py").read_text()  # read once, written per run


def configure(launch: AgentLaunch) -> AgentCommand:
    trajectory = launch.home / "mini.traj.json"
    # Its prompt is a system template and an instance template (workflow rules around the task): a system
    # prompt replaces both, leaving the task alone in the user turn.
    system = []
    if launch.system_prompt is not None:
        system = ["-c", f"agent.system_template={json.dumps(launch.system_prompt)}"]
        system += ["-c", "agent.instance_template={{task}}"]
    argv = [
        launch.binary,
        "-y",
        "--exit-immediately",
        "-m",
        launch.model,
        "-t",
        launch.task,
        "-c",
        "mini.yaml",
        "-c",
        f"model.model_class={MODEL_MODULE}.ProxyChatModel",
        "-c",
        f"agent.step_limit={launch.max_steps}",
        "-c",
        "agent.cost_limit=0",
        *system,
        "-o",
        str(trajectory),
    ]
    return AgentCommand(
        argv=argv,
        env={
            "MSWEA_GLOBAL_CONFIG_DIR": str(launch.home / "mini-swe-agent"),
            "MSWEA_CONFIGURED": "1",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "PYTHONPATH": str(launch.home),
            "OPENAI_API_KEY": launch.api_key,
            "OPENAI_API_BASE": f"{launch.base_url}/v1",
            "PYTHONUNBUFFERED": "1",
        },
        files={launch.home / f"{MODEL_MODULE}.py": MODEL_SOURCE},
        outputs={"trajectory": trajectory},
    )


SPEC = AgentSpec(
    name="mini-swe-agent",
    binary="mini",
    dialect="openai_chat",
    install=Install("pip", "mini-swe-agent", "2.4.6"),
    configure=configure,
    max_steps=8,
)
