"""``python -m harness_grpo.agents``: the registry as a table; ``--install-specs`` and ``--binaries`` for
``launchers/install_agents.sh`` (one pinned requirement or executable name per line, for one manager)."""

from __future__ import annotations

import argparse

from harness_grpo.agents.registry import REGISTRY, agent_binary, install_specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness_grpo.agents", description=__doc__)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--install-specs", choices=("npm", "pip"), help="the pinned requirements MANAGER installs")
    which.add_argument("--binaries", choices=("npm", "pip"), help="the executables MANAGER installs")
    args = parser.parse_args(argv)
    if args.install_specs:
        print("\n".join(install_specs(args.install_specs)))
    elif args.binaries:
        print("\n".join(spec.binary for spec in REGISTRY.values() if spec.install.manager == args.binaries))
    else:
        for name, spec in REGISTRY.items():
            installed = agent_binary(name) or "not installed"
            print(f"{name:16} {spec.dialect:20} {spec.install.manager} {spec.install.spec:34} {installed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
