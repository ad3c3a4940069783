"""Writing files so that a reader sees the old contents or the new, never half of them."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes | str, *, durable: bool = True) -> None:
    """Replace ``path``'s contents with ``data`` in one step.

    ``data`` goes to ``<path>.tmp`` beside it, which is then renamed over ``path``. With
    ``durable``, the file is flushed to disk before the rename and its folder after, so the
    new contents survive a crash once this returns. A ``str`` is written as UTF-8.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> write_atomic(folder / "a.json", '{"done": []}')
    >>> (folder / "a.json").read_text(), sorted(p.name for p in folder.iterdir())
    ('{"done": []}', ['a.json'])
    """
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Flush ``folder``'s entries (names created, renamed or removed in it) to disk, where
    the folder can be opened for that; else do nothing."""
    try:
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
