"""``launchers/uv_install.py`` hands uv the package sources pip is configured with, at pip's precedence."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("uv_install", REPO / "launchers" / "uv_install.py")
assert spec is not None and spec.loader is not None
uv_install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_install)


@pytest.fixture(autouse=True)
def no_pip_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip reads ``PIP_*`` variables over its files: the tests set the ones they mean."""
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)


def _values(command: list[str], option: str) -> list[str]:
    return [command[i + 1] for i, arg in enumerate(command) if arg == option]


def test_pips_files_and_variables_become_uvs_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\nindex-url = https://mirror.example/simple\n"
        "extra-index-url = file:///srv/a/simple file:///srv/b/simple\nfind-links = /srv/global-wheels\n"
        "constraint = /srv/constraints.txt\ncert = /srv/ca.pem\n"
        "[install]\nindex-url = https://install.example/simple\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_FIND_LINKS", "/srv/env-wheels")

    settings = uv_install.pip_settings()
    command = uv_install.uv_command(["-e", ".[dev]"], settings)

    assert command[:3] == [str(Path(sys.executable).with_name("uv")), "pip", "install"]
    assert _values(command, "--python") == [sys.executable]
    assert _values(command, "--index-url") == ["https://install.example/simple"]  # [install] over [global]
    assert _values(command, "--extra-index-url") == ["file:///srv/a/simple", "file:///srv/b/simple"]
    assert _values(command, "--find-links") == ["/srv/env-wheels"]  # a PIP_ variable over the files
    assert _values(command, "--constraint") == ["/srv/constraints.txt"]
    assert _values(command, "--index-strategy") == ["unsafe-best-match"]
    assert command[-2:] == ["-e", ".[dev]"]
    assert settings["cert"] == "/srv/ca.pem"


def test_without_pip_configuration_uv_gets_only_the_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)

    command = uv_install.uv_command(["pkg"], uv_install.pip_settings())

    assert not {"--index-url", "--extra-index-url", "--find-links", "--constraint"} & set(command)
    assert command[-1] == "pkg"
