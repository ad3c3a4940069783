"""Writing files safely: atomically (a reader sees the old contents or the new, never half of
them), exclusively (never through a symbolic link, never over a file that is already there),
and by one writer at a time (an exclusive lock that dies with its process)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
"""Flags that open a path only if it is not a symbolic link (and keep it from children)."""

NEW = os.O_CREAT | os.O_EXCL | NOFOLLOW
"""Flags that create a file only where nothing is, and never through a symbolic link."""


class LockHeld(BlockingIOError):
    """Another process holds the lock; ``pid`` is its process id when it could be read."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(errno.EWOULDBLOCK, "locked by another process", str(path))
        self.pid = pid


_TOKEN_BYTES = 8
TEMPORARY_SUFFIX = len(".") + 2 * _TOKEN_BYTES + len(".tmp")
"""Bytes :func:`write_atomic` adds to a name for its new file (``.<16 hex digits>.tmp``)."""


def not_regular(path: Path) -> str | None:
    """What ``path`` is where it is there and not a regular file, or a symbolic link to one
    (``"a character device"``, ``"a folder"``, ...), else ``None`` (a link that leads
    nowhere too).

    >>> not_regular(Path("/dev/null")), not_regular(Path("/nowhere/at/all"))
    ('a character device', None)
    """
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):  # (replaced, not followed: /dev/stdout is a link to a device)
            mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "a socket")


def write_atomic(
    path: Path, data: bytes | str, *, durable: bool = True, tmp: Path | None = None
) -> None:
    """Replace ``path``'s contents with ``data`` in one step.

    ``data`` goes to a new file beside it — ``tmp``, or ``<path>.<random>.tmp`` — created
    exclusively (never through a symbolic link, never over another file), which is then
    renamed over ``path`` (a symbolic link there is replaced, not followed). A file left at
    ``tmp`` by an earlier, interrupted write of the caller's own is removed first. With
    ``durable``, the file is flushed to disk before the rename and its folder after, so the
    new contents survive a crash once this returns. If anything fails, the new file is
    removed and ``path`` is as it was. A ``str`` is written as UTF-8. A ``path`` that is a
    folder, a device, a pipe or a socket is refused (``OSError``), never replaced.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> write_atomic(folder / "a.json", '{"done": []}')
    >>> (folder / "a.json").read_text(), sorted(p.name for p in folder.iterdir())
    ('{"done": []}', ['a.json'])
    """
    kind = not_regular(path)
    if kind is not None:  # (renamed over, a device or a pipe would be replaced by the file)
        raise OSError(errno.EINVAL, f"it is {kind}, not a file that can be replaced", str(path))
    if tmp is None:
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(_TOKEN_BYTES)}.tmp")
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | NEW, 0o666)
    try:
        try:
            write_all(fd, data.encode() if isinstance(data, str) else data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def write_all(fd: int, data: bytes | memoryview, pos: int | None = None) -> None:
    """Write all of ``data`` to ``fd`` (at ``pos`` when given, else where the file is)."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        if pos is None:
            done += os.write(fd, view[done:])
        else:
            done += os.pwrite(fd, view[done:], pos + done)


def read_exactly(fd: int, view: memoryview, pos: int) -> bool:
    """Fill ``view`` from ``fd`` at ``pos``; False when the file ends first."""
    view = view.cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], pos + done)
        if n <= 0:
            return False
        done += n
    return True


def open_regular(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of the regular file at ``path``, opened without following a symbolic
    link (``OSError`` ELOOP for one) and refused (``OSError`` EINVAL) if it is not a regular
    file; nothing is created."""
    fd = os.open(path, flags | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def identity(path: Path) -> int | None:
    """The inode number of what lies at ``path`` itself (a symbolic link's own), or None."""
    try:
        return os.lstat(path).st_ino
    except FileNotFoundError:
        return None


def place(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` (in the same folder), never replacing anything already at
    ``dst`` (``FileExistsError``). A file is linked to its new name and then unlinked from the
    old one, so a crash in between leaves both names for the same file, never neither."""
    if stat.S_ISDIR(os.lstat(src).st_mode):
        linked = False
    else:
        try:
            os.link(src, dst, follow_symlinks=False)
            linked = True
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            linked = False  # a file system without hard links
    if linked:
        os.unlink(src)
    else:
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
        os.rename(src, dst)
    fsync_dir(dst.parent)


_LOCK_TEXT = re.compile(rb"(?:shardwise ([0-9]{1,10})\n)?")


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the lock file ``path`` (created when missing; one left by
    a killed holder is reused) while the block runs; its process id is written in it, and the
    file is removed at the end. The lock dies with its process.

    Raises :class:`LockHeld` at once when another process holds it, and ``FileExistsError``
    (leaving it as it is) when ``path`` is a symbolic link or anything but a lock file.
    """
    import fcntl  # POSIX only: imported where it is used

    flags = os.O_RDWR | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise FileExistsError(errno.EEXIST, "not a lock file", str(path)) from None
            raise
        try:
            st = os.fstat(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                found = _LOCK_TEXT.fullmatch(os.pread(fd, 64, 0))
                raise LockHeld(path, int(found[1]) if found and found[1] else None) from None
            if identity(path) == st.st_ino:  # else removed or replaced meanwhile: lock anew
                if not stat.S_ISREG(st.st_mode) or not _LOCK_TEXT.fullmatch(os.pread(fd, 64, 0)):
                    raise FileExistsError(errno.EEXIST, "not a lock file", str(path))
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        write_all(fd, f"shardwise {os.getpid()}\n".encode(), 0)
        yield
    finally:
        if identity(path) == st.st_ino:
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(fd)


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


def free_bytes(folder: Path) -> int | None:
    """Bytes free on ``folder``'s disk, or None when that cannot be told."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def drop_cached(fd: int, spans: list[tuple[int, int]]) -> None:
    """Let the page cache drop these ``(position, length)`` spans of ``fd``, already on disk.

    A streamed run writes as much output as it likes, so its pages would otherwise crowd
    the page cache (and the inputs in it) until the kernel evicts them. Freeing them at
    once also lets the next chunk's writes reuse the same, recently used memory: in a
    virtual machine that hands free memory back to its host, writing into memory that has
    been handed back costs a fault on the host for every page.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    for pos, length in spans:
        try:
            os.posix_fadvise(fd, pos, length, os.POSIX_FADV_DONTNEED)
        except OSError:  # only advice: the data are on disk whatever the cache does
            return
