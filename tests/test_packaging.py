"""Pins are exact and agree between requirements/ and pyproject.toml; CI runs the README test command."""

from __future__ import annotations

import re

import tomllib

from conftest import REPO

EXTRA_FILES = {
    "atari": "requirements-atari.txt",
    "mujoco": "requirements-mujoco.txt",
    "procgen": "requirements-procgen.txt",
    "cloud": "requirements-cloud.txt",
    "optuna": "requirements-optuna.txt",
    "plot": "requirements-plot.txt",
    "test": "requirements-test.txt",
}


def pins(path):
    """The `name==version` lines of a requirements file (comments, -r and -e lines left out)."""
    result = []
    for line in (REPO / "requirements" / path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][A-Za-z0-9.+]*", line), f"{path}: not an exact pin: {line}"
        result.append(line)
    return result


def pyproject():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_core_pins_match_pyproject_and_torch_is_pinned():
    core = pins("requirements.txt")
    assert "torch==2.13.0" in core
    assert sorted(pyproject()["dependencies"]) == sorted(core)


def test_extras_match_requirement_files():
    extras = pyproject()["optional-dependencies"]
    assert set(extras) == set(EXTRA_FILES)
    for extra, path in EXTRA_FILES.items():
        assert sorted(extras[extra]) == sorted(pins(path)), extra


def test_one_version_per_package_everywhere():
    seen = {}
    for path in ["requirements.txt", *EXTRA_FILES.values()]:
        for pin in pins(path):
            name, version = pin.split("==")
            assert seen.setdefault(name.lower(), version) == version, f"{name} pinned twice differently"


def readme_quickstart_commands():
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Quick start.*?```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert block, "README has no quick start code block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_quick_start_has_two_commands_and_ci_runs_the_test_one_verbatim():
    commands = readme_quickstart_commands()
    assert len(commands) == 2, commands
    assert "torchrun" in commands[0] and "ppo_atari_multigpu.py" in commands[0]
    assert "pytest" in commands[1]
    assert commands[1] in (REPO / ".ci" / "run").read_text()
