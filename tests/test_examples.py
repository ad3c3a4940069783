"""The examples: notebooks are valid, stored without outputs, and set up simulated devices
first; the tutorial script runs. (The docs build executes every notebook with
``examples/execute.py``.)"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
EXPECTED = {"tutorial", "run", "see", "plan", "fast", "beyond_memory", "dask"}


def calls_use_cpu_devices(source: str) -> bool:
    """Whether ``source`` calls ``use_cpu_devices`` (as ``shardwise.use_cpu_devices(...)`` or
    imported by name)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name == "use_cpu_devices":
                return True
    return False


def test_every_capability_has_a_notebook() -> None:
    missing = EXPECTED - {p.stem for p in NOTEBOOKS}
    assert not missing, f"no notebook for {sorted(missing)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_cleared_and_sets_up_devices(path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    assert nb.nbformat == 4
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    for k, cell in enumerate(code):
        assert cell.outputs == [], f"{path.name}: code cell {k} has stored outputs; clear them"
        assert cell.execution_count is None, f"{path.name}: code cell {k} has an execution count"
    assert calls_use_cpu_devices(code[0].source), (
        f"{path.name}: the first code cell must call shardwise.use_cpu_devices(...) before any "
        "JAX computation"
    )


def test_tutorial_script_runs() -> None:
    script = EXAMPLES / "tutorial.py"
    assert calls_use_cpu_devices(script.read_text())
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=EXAMPLES,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all five scenarios agree with NumPy" in done.stdout
