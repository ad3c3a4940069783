"""Execute every notebook under examples/ and run examples/tutorial.py.

    python examples/execute.py [--out docs/examples] [--timeout 120] [--no-tutorial] [NOTEBOOK ...]

Each notebook runs in a fresh Jupyter kernel started with this Python (``sys.executable``, so
the project's virtual environment), from the examples folder, with a time limit per cell. The
executed notebooks, outputs included, are written to ``--out`` (created if missing; a notebook
that fails is written too, up to its failing cell), and the tutorial script's output to
``--out``/tutorial.txt. Prints each one's time; exits 1 naming the notebook and the cell that
failed, after running the rest.

Needs ``nbclient``, ``nbformat`` and ``ipykernel`` in this Python.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

EXAMPLES = Path(__file__).resolve().parent
DOCS = EXAMPLES.parent / "docs" / "examples"
KERNEL = "shardwise-examples"
TUTORIAL_TIMEOUT_S = 300
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colours in tracebacks


def kernel_manager_class(kernels: Path) -> type[AsyncKernelManager]:
    """A kernel manager whose kernel runs ``ipykernel`` on this very Python, whatever Jupyter
    kernelspecs are installed elsewhere (a user's ``python3`` spec may point to another one),
    over Unix sockets in the private folder ``kernels`` rather than TCP on localhost.

    nbclient's time limit per cell works only with the asynchronous manager, and nbclient
    shuts the kernel down only when it creates the manager itself: so a class, not an instance.
    """
    spec = kernels / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "shardwise examples", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))

    class Manager(AsyncKernelManager):
        def __init__(self, **kwargs: Any) -> None:
            specs = KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)
            ipc = str(kernels / "ipc")
            super().__init__(kernel_spec_manager=specs, transport="ipc", ip=ipc, **kwargs)

    return Manager


def client(nb: Any, kernels: Path, timeout: int) -> NotebookClient:
    return NotebookClient(
        nb,
        kernel_name=KERNEL,
        kernel_manager_class=kernel_manager_class(kernels),
        timeout=timeout,
        shutdown_kernel="immediate",  # (a kernel stopped at a time limit has nothing to save)
        resources={"metadata": {"path": str(EXAMPLES)}},  # the notebooks run from examples/
    )


def check_kernel(kernels: Path, timeout: int) -> None:
    """Fail unless the kernel's Python is this one."""
    probe = nbformat.v4.new_notebook()
    probe.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.executable, end='')"))
    client(probe, kernels, timeout).execute()
    found = "".join(o.get("text", "") for o in probe.cells[0].outputs)
    if Path(found).absolute() != Path(sys.executable).absolute():
        sys.exit(f"the notebook kernel runs {found!r}, not {sys.executable!r}; stopping.")
    print(f"kernel: {found}")


def execute(path: Path, out: Path, kernels: Path, timeout: int) -> str | None:
    """Execute one notebook cell by cell, write it with its outputs to ``out``; the failure,
    or ``None``."""
    nb = nbformat.read(path, as_version=4)
    runner = client(nb, kernels, timeout)
    failure = None
    with runner.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            try:
                runner.execute_cell(cell, index)
            except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
                # (the message shows the cell's source and the traceback)
                message = ANSI.sub("", str(e)).strip()
                failure = f"{path.name}: cell {index} failed ({type(e).__name__}):\n{message}"
                break
    nbformat.write(nb, out / path.name)
    return failure


def run_tutorial(out: Path) -> str | None:
    """Run tutorial.py in a subprocess; its output goes to ``out``/tutorial.txt."""
    script = EXAMPLES / "tutorial.py"
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=TUTORIAL_TIMEOUT_S,
            cwd=EXAMPLES,
        )
    except subprocess.TimeoutExpired:
        return f"tutorial.py: did not finish in {TUTORIAL_TIMEOUT_S} s"
    (out / "tutorial.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        return f"tutorial.py: exit status {done.returncode}:\n{tail}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: examples/*.ipynb")
    parser.add_argument(
        "--out", type=Path, default=DOCS, help="where to write them (default: docs/examples)"
    )
    parser.add_argument("--timeout", type=int, default=120, help="seconds per cell")
    parser.add_argument("--no-tutorial", action="store_true", help="skip tutorial.py")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted(EXAMPLES.glob("*.ipynb"))
    args.out.mkdir(parents=True, exist_ok=True)
    failures = []
    with tempfile.TemporaryDirectory(prefix="shardwise-kernels-") as kernels:
        check_kernel(Path(kernels), args.timeout)
        for path in notebooks:
            start = time.perf_counter()
            failure = execute(path, args.out, Path(kernels), args.timeout)
            status = "FAILED" if failure else "ok"
            print(f"{path.name:<24} {time.perf_counter() - start:6.1f} s  {status}", flush=True)
            if failure:
                failures.append(failure)
    if not args.no_tutorial:
        start = time.perf_counter()
        failure = run_tutorial(args.out)
        status = "FAILED" if failure else "ok"
        print(f"{'tutorial.py':<24} {time.perf_counter() - start:6.1f} s  {status}", flush=True)
        if failure:
            failures.append(failure)
    for failure in failures:
        print(f"\n{failure}", file=sys.stderr)
    if failures:
        return 1
    print(f"executed notebooks written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
