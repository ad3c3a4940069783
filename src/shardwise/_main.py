"""The ``shardwise`` command's entry point: it first restarts the process with huge pages
where that helps (:func:`~shardwise._runtime.hostmem.rerun_with_huge_pages`), before the
command's modules and JAX are imported, so that a restart costs a tenth of a second rather
than a second of imports done twice; then it runs the command (:func:`shardwise.cli.main`).
"""

from __future__ import annotations


def main() -> None:
    """Entry point of the ``shardwise`` console script and of ``python -m shardwise``."""
    from shardwise._runtime.hostmem import rerun_with_huge_pages

    rerun_with_huge_pages()
    from shardwise.cli import main as run

    run()
