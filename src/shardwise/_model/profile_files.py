"""Profile files: the calibrated profiles in the user's cache, files given by path, and which
profile the devices here use by default.

A profile file is untrusted input. It is read only when it is a regular file (never through a
symbolic link, never waiting on a FIFO), at most :data:`MAX_PROFILE_BYTES`, and every figure
is checked (:meth:`~shardwise._model.profile.Profile.from_json`). A file the user names that
fails is an error; a calibrated one in the cache that fails is set aside with a
:class:`~shardwise.ShardwiseWarning`, and the built-in profile is used.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

from shardwise._caches import cached
from shardwise._errors import ArgumentError, ShardwiseError, ShardwiseWarning
from shardwise._files import open_regular, write_atomic
from shardwise._model.profile import BUILTIN, InvalidProfile, Profile

MAX_PROFILE_BYTES = 2**20
"""The largest profile file read, 1 MiB: a calibrated profile of a mesh of many axes is a few
KiB, so anything larger is not a profile."""

_GIVE_A_PROFILE = "give the path of a profile JSON file (shardwise calibrate writes one)"


def cache_root() -> Path:
    """shardwise's cache: ``$XDG_CACHE_HOME/shardwise`` or ``~/.cache/shardwise``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardwise"


def cache_dir() -> Path:
    """Where calibrated profiles live: ``profiles`` in :func:`cache_root`."""
    return cache_root() / "profiles"


def local_name(platform: str, count: int) -> str:
    """Name of the calibrated profile for ``count`` devices of ``platform``."""
    return f"local-{platform}-{count}"


def save_profile(profile: Profile, path: Path | None = None) -> Path:
    """Write ``profile`` as JSON (by default into :func:`cache_dir`)."""
    path = path or cache_dir() / f"{profile.name}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(profile.to_json(), indent=2))
    except OSError as e:
        raise ShardwiseError(f"cannot write profile {str(path)!r}: {e.strerror or e}.") from None
    return path


def load_profile(name: str) -> Profile:
    """A built-in profile, a calibrated one from the cache, or a JSON file.

    Raises:
        ArgumentError: when nothing by that name exists (lists what does), or when the file
            is not a usable profile (:func:`read_profile` says why).
    """
    if name in BUILTIN:
        return BUILTIN[name]
    for path in (Path(name), cache_dir() / f"{name}.json"):
        # lexists, not is_file: a link, a FIFO or a device by that name is refused, not passed;
        # a folder too where the name is a path (a bare name may be a folder of that name)
        folder = path.is_dir() and not path.is_symlink()
        if os.path.lexists(path) and (not folder or os.sep in name):
            return read_profile(path)
    cached = sorted(p.stem for p in cache_dir().glob("*.json")) if cache_dir().is_dir() else []
    raise ArgumentError(
        f"no profile named {name!r}; valid names are {', '.join([*BUILTIN, *cached])}, or give "
        "the path of a profile JSON file (shardwise calibrate writes one)."
    )


def read_profile(path: Path) -> Profile:
    """The profile in the JSON file at ``path``, read as untrusted input: only a regular file,
    not through a symbolic link, never waiting on a FIFO, at most :data:`MAX_PROFILE_BYTES`,
    and every figure checked (:meth:`Profile.from_json`).

    Raises:
        ArgumentError: in one line naming the file, when it is not a usable profile.
    """
    return _load(path)[0]


class UnusableProfileFile(ArgumentError):
    """A profile file cannot be used; ``fact`` says why, phrased to follow its name."""

    def __init__(self, path: Path, fact: str, fix: str = _GIVE_A_PROFILE) -> None:
        super().__init__(f"profile file {str(path)!r} {fact}; {fix}.")
        self.fact = fact


def _load(path: Path) -> tuple[Profile, dict[str, Any]]:
    """The profile at ``path`` and the JSON object it was read from (:func:`read_profile`)."""
    try:
        fd = open_regular(path)
    except OSError as e:
        raise UnusableProfileFile(path, *_why_unreadable(path, e)) from None
    try:
        with os.fdopen(fd, "rb") as f:  # a buffered read stops at the limit or the end
            raw = f.read(MAX_PROFILE_BYTES + 1)
    except OSError as e:
        raise UnusableProfileFile(path, f"cannot be read ({e.strerror or e})") from None
    if len(raw) > MAX_PROFILE_BYTES:
        size = f"{MAX_PROFILE_BYTES // 2**20} MiB"
        raise UnusableProfileFile(path, f"is over {size}, which no profile is")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise UnusableProfileFile(path, "is not a profile: its JSON is nested too deeply") from None
    except ValueError as e:  # not JSON, or not UTF-8
        raise UnusableProfileFile(path, f"is not valid JSON ({e})") from None
    try:
        return Profile.from_json(data), data
    except InvalidProfile as e:
        raise UnusableProfileFile(
            path,
            f"is not a usable profile: {e.fact}",
            "fix it, or write a new one with shardwise calibrate",
        ) from None


def _why_unreadable(path: Path, e: OSError) -> tuple[str, str]:
    """Why ``open_regular`` refused ``path`` (following its name), and the fix."""
    if e.errno == errno.ELOOP:
        return (
            f"is a symbolic link (to {os.path.realpath(path)}), and profiles are read only from "
            "regular files, never through a link",
            "give the path of the file itself",
        )
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = 0
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return f"is {kind}, not a regular file", _GIVE_A_PROFILE
    return f"cannot be read ({e.strerror or e})", _GIVE_A_PROFILE


def default_profile(platform: str, count: int) -> Profile:
    """The calibrated profile for these devices if there is one, else a built-in guess.

    The file is read again whenever it changes (its size, time or inode), so a profile
    recalibrated while a program runs is used from then on. A calibrated profile that cannot
    be used (unreadable, invalid, for another platform, or from an older cost model) is set
    aside with a :class:`~shardwise.ShardwiseWarning` naming the file, once per version of it.
    """
    found = _read_profile(*stamp, platform) if (stamp := profile_stamp(platform, count)) else None
    if found is not None:
        return found
    return builtin_default(platform)


def builtin_default(platform: str) -> Profile:
    """The built-in profile used for ``platform``'s devices when none is calibrated."""
    return {"cpu": BUILTIN["cpu-2core"], "tpu": BUILTIN["tpu-v5e"]}.get(platform, BUILTIN["h100"])


def profile_stamp(platform: str, count: int) -> tuple[str, tuple[int, int, int]] | None:
    """Which calibrated profile file :func:`default_profile` reads for these devices, as it is
    now (path; modification time, size, inode), or ``None`` where there is none: a cheap key
    for caches whose values depend on the profile."""
    path = _profile_path(os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"), platform, count)
    try:
        st = os.lstat(path)  # the link itself, where it is one (it is refused)
    except OSError:
        return None
    return path, (st.st_mtime_ns, st.st_size, st.st_ino)


@cached(maxsize=16)
def _profile_path(xdg: str | None, home: str | None, platform: str, count: int) -> str:
    """The calibrated profile's path for these settings of ``XDG_CACHE_HOME`` and ``HOME``."""
    return str(cache_dir() / f"{local_name(platform, count)}.json")


@cached(maxsize=16)
def _read_profile(path: str, stamp: tuple[int, int, int], platform: str) -> Profile | None:
    """The calibrated profile of ``platform``'s devices in the file at ``path`` as it was at
    ``stamp``, or ``None`` (with a warning) where it cannot be used: unreadable, invalid, for
    another platform, or a CPU profile calibrated before the CPU model took collectives as
    one step and matmuls as packing plus multiplying (no ``gather`` key): its figures were
    fitted to the older model, and the built-in one is closer until ``shardwise calibrate``
    runs again."""
    instead = f"planning with the built-in profile {builtin_default(platform).name} instead"
    try:
        profile, data = _load(Path(path))
    except UnusableProfileFile as e:
        _set_aside(
            f"calibrated profile {path!r} {e.fact}; {instead}. Run shardwise calibrate to "
            "measure these devices again."
        )
        return None
    if profile.platform != platform:
        _set_aside(
            f"calibrated profile {path!r} is for {profile.platform} devices, not the {platform} "
            f"devices here; {instead}. Run shardwise calibrate on these devices, or remove it."
        )
        return None
    if platform == "cpu" and "gather" not in data:
        _set_aside(
            f"calibrated profile {path!r} was measured for an older CPU cost model (it has no "
            f"gather figures); {instead}. Run shardwise calibrate to measure these devices again."
        )
        return None
    return profile


def _set_aside(message: str) -> None:
    warnings.warn(message, ShardwiseWarning, stacklevel=4)
