"""Coding-agent CLIs (opencode, codex, claude-code, mini-swe-agent) as registry entries, run in a sandbox.

- ``spec``: ``AgentSpec`` (name, binary, dialect, install pin, ``configure``, default step limit) and
  what ``configure`` takes (``AgentLaunch``) and gives (``AgentCommand``);
- one module per agent (``opencode``, ``codex``, ``claude_code``, ``mini_swe_agent``) holding its ``SPEC``
  and its ``configure``, with the wiring it needs in its docstring (REFERENCE §4.4);
- ``registry``: ``REGISTRY``, ``AGENTS``, ``get_agent``, ``agent_binary``, ``install_specs``;
- ``run``: ``run_agent`` (one hermetic run in a ``harness_grpo.sandbox.Sandbox``), ``AgentRun``,
  ``SMALL_MODEL_PROMPT``.

``CLIAgentSessionFactory`` (``harness_grpo.agent_sessions``) makes any entry a training harness.
``python -m harness_grpo.agents`` lists the registry; ``--install-specs npm|pip`` prints the pins
``launchers/install_agents.sh`` installs.

Adding an agent:

1. a module here with its ``configure(launch) -> AgentCommand`` (config files, argv, environment; its
   model client must use ``launch.api_key`` and reach ``launch.base_url`` in its dialect) and its
   ``SPEC = AgentSpec(...)``;
2. the module in ``REGISTRY``'s tuple (``registry.py``);
3. ``bash launchers/install_agents.sh``: it installs the new pin, and ``tests/agents`` run the agent
   through the proxy (``test_agent_clis.py``) once its binary is there (if its shell tool has a name the
   fake engine does not know, add it to ``SHELL_TOOLS`` in ``tests/agents/conftest.py``).
"""

from harness_grpo.agents.registry import AGENTS, REGISTRY, agent_binary, get_agent, install_specs
from harness_grpo.agents.run import SMALL_MODEL_PROMPT, AgentRun, run_agent
from harness_grpo.agents.spec import AgentCommand, AgentLaunch, AgentSpec, Install

__all__ = [
    "AGENTS",
    "REGISTRY",
    "SMALL_MODEL_PROMPT",
    "AgentCommand",
    "AgentLaunch",
    "AgentRun",
    "AgentSpec",
    "Install",
    "agent_binary",
    "get_agent",
    "install_specs",
    "run_agent",
]
