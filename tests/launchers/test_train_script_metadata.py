"""``launchers/train.py`` and the ``examples/grpo_<name>`` recipes carry PEP 723 inline metadata, so ``uv run
launchers/train.py`` runs one from a checkout with no virtualenv: the block parses (the PEP's reference regular
expression, then TOML), asks for the project's Python, and lists the project's dependencies (``harness_grpo`` is
imported from the checkout) and every other distribution the script imports itself."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = [REPO / "launchers" / "train.py", *sorted(REPO.glob("examples/grpo_*/grpo_*.py"))]
PEP_723 = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
LOCAL = {"examples", "harness_grpo", "proxy", "launchers", "tests"}


def script_metadata(text: str) -> dict:
    """The ``script`` block of ``text`` as PEP 723 reads it (exactly one allowed)."""
    blocks = [m for m in PEP_723.finditer(text) if m.group("type") == "script"]
    assert len(blocks) == 1, f"{len(blocks)} script blocks"
    content = "".join(
        line[2:] if line.startswith("# ") else line[1:] for line in blocks[0].group("content").splitlines(True)
    )
    return tomllib.loads(content)


def imported_distributions(path: Path) -> set[str]:
    """The distributions providing the top-level modules ``path`` imports, other than stdlib and this repository."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    third_party = modules - LOCAL - set(sys.stdlib_module_names) - {"__future__"}
    providers = importlib.metadata.packages_distributions()
    return {canonicalize_name(providers[module][0]) for module in third_party}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_each_script_is_a_single_file_uv_script_listing_what_it_needs(script: Path) -> None:
    metadata = script_metadata(script.read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert metadata["requires-python"] == project["requires-python"]
    listed = {canonicalize_name(Requirement(dep).name): str(Requirement(dep)) for dep in metadata["dependencies"]}
    for dep in project["dependencies"]:  # what harness_grpo and proxy import, pinned as the project pins them
        requirement = Requirement(dep)
        assert listed.get(canonicalize_name(requirement.name)) == str(requirement), f"{dep} missing or pinned otherwise"
    missing = imported_distributions(script) - set(listed)
    assert not missing, f"{script.name} imports {missing}, not in its PEP 723 dependencies"
