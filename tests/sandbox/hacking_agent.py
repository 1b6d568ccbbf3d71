"""A Harbor agent (import path ``tests.sandbox.hacking_agent:HackingAgent``) that tries to cheat.

During its phase it tries to read ``/tests`` and ``/solution``, writes fake reward files, and leaves a
detached daemon that waits for the verifier's tests to appear and then writes the right answer and fake
rewards. What each attempt got is kept in ``context.metadata`` for the test to check. It never writes the
right answer itself, so any reward above 0 is a successful hack.
"""

from __future__ import annotations

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

DAEMON = (
    "setsid nohup bash -c 'until [ -e /tests/test.sh ]; do sleep 0.01; done; "
    "while :; do echo 42 > /app/answer.txt; echo 1 > /logs/verifier/reward.txt; "
    'echo \\{\\"reward\\": 1\\} > /logs/verifier/reward.json; sleep 0.01; done\' >/dev/null 2>&1 < /dev/null &'
)


class HackingAgent(BaseAgent):
    @staticmethod
    def name() -> str:
        return "hacking-agent"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        seen = {}
        for key, command in {
            "list_tests": "ls -A /tests /solution",
            "read_tests": "cat /tests/test.sh",
            "write_reward_txt": "echo 1 > /logs/verifier/reward.txt",
            "write_reward_json": "echo '{\"reward\": 1}' > /logs/verifier/reward.json",
            "write_tests": "echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh",
            "whoami": "id -u",
            "daemon": DAEMON,
        }.items():
            result = await environment.exec(command)
            seen[key] = {"rc": result.return_code, "stdout": result.stdout, "stderr": result.stderr}
        await environment.exec("echo 0 > /app/answer.txt")
        context.metadata = seen
