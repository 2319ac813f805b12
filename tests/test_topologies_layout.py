"""The machine layer's shape: topologies/ sits below the twin, in small modules (issue 16, item 6)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from topologies.errors import InputError
from topologies.specs import COLLECTIVE_KINDS

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted((ROOT / "topologies").rglob("*.py"))
MAX_LINES = 400


def _imported(path: Path) -> set[str]:
    """Top-level package of every import in a module, wherever in the module it sits."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_there_are_modules_to_check():
    names = {p.name for p in MODULES}
    assert {"machine.py", "specs.py", "fabric.py", "errors.py", "dragonfly.py", "fattree.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_topologies_imports_neither_twin_nor_executor(path):
    assert not _imported(path) & {"twin", "executor"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_short_and_says_its_job(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    assert ast.get_docstring(ast.parse(text)), f"{path.name} has no module docstring"


def test_collective_kinds_match_the_ir():
    from twin.ir import COLLECTIVE_KINDS as IR_KINDS

    assert COLLECTIVE_KINDS == IR_KINDS


def test_twin_error_is_the_machine_layers_input_error():
    from twin.errors import TwinError

    assert TwinError is InputError
    with pytest.raises(TwinError, match="unknown machine"):
        from topologies.machine import load_machine

        load_machine("no-such-machine")


def test_the_error_module_loads_nothing_heavy():
    """twin.errors is imported by every command: it must not drag numpy and networkx in through topologies."""
    code = "import sys, twin.errors; print(sorted({'numpy', 'networkx'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
