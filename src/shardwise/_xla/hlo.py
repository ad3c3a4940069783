"""Read collectives out of compiled HLO text and name their groups by the user's mesh axes.

Replica groups print in several forms, all handled here:

- explicit lists: ``replica_groups={{0,1,2,3},{4,5,6,7}}`` (``{}``: every device in one group);
- iota lists: ``replica_groups=[2,4]<=[8]``, optionally transposed: ``[4,2]<=[2,4]T(1,0)``;
- XLA's mesh form: ``replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}``, optionally with
  ``device_ids=([2,4]T(1,0))`` and sub-axes such as ``{'axis_0':(2)2}``.

Device numbers in SPMD HLO are positions in the mesh's device order
(``mesh.devices.flat``), so a group maps back to mesh coordinates directly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

import numpy as np

from shardwise._model.collective import Collective as BaseCollective

CollectiveKind: TypeAlias = Literal[
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"
]
KINDS: tuple[CollectiveKind, ...] = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)

_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}

_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+"
    r"(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SOURCE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_HEADER = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*->.*\{\s*$")
_ROOT = re.compile(r"^\s*ROOT\s+%?[\w.\-]+\s*=\s*\S+\s+([\w\-]+)\(")
_APPLY = re.compile(r"to_apply=%?([\w.\-]+)")


def _roots(hlo_text: str) -> dict[str, str]:
    """Each computation's root opcode, by name (``add`` for an all-reduce's summing one)."""
    roots, name = {}, ""
    for line in hlo_text.splitlines():
        head = _HEADER.match(line)
        if head:
            name = head.group(1)
        elif name and (root := _ROOT.match(line)):
            roots[name] = root.group(1)
    return roots


@dataclass(frozen=True, slots=True)
class Collective(BaseCollective):
    """One collective in a compiled program.

    Attributes:
        kind: the collective's HLO kind.
        mesh_axes: the user's mesh axes its device groups span.
        bytes: size of its result on one device, in bytes.
        groups: the device groups (positions in the mesh), as XLA wrote them.
        hlo_name: the HLO instruction's name.
        op_name: the JAX operation that produced it, from HLO metadata ('' if absent).
        source: ``file:line (function)`` of the user code behind it, where the metadata has it.
        shape: the dimensions of its (first) result array on one device.
        combiner: how an all-reduce or a reduce-scatter combines the devices' parts: the
            root op of its ``to_apply`` (``add``, ``maximum``, ...; ``""``: none or unknown).
    """

    groups: tuple[tuple[int, ...], ...] = ()
    hlo_name: str = ""
    shape: tuple[int, ...] = field(default=(), kw_only=True)
    combiner: str = field(default="", kw_only=True)


def _array_bytes(text: str) -> list[int]:
    out = []
    for dtype, dims in _ARRAY.findall(text):
        width = _DTYPE_BYTES.get(dtype)
        if width is None:
            digits = re.findall(r"\d+", dtype)
            width = max(1, int(digits[-1]) // 8) if digits else 4
        out.append(width * math.prod(int(d) for d in dims.split(",") if d))
    return out


def _result_shape(text: str, start: bool, kind: str) -> tuple[int, ...]:
    arrays = _ARRAY.findall(text)
    if not arrays:
        return ()
    pick = 1 if start and kind in ("all-gather", "collective-permute") and len(arrays) > 1 else 0
    return tuple(int(d) for d in arrays[pick][1].split(",") if d)


def _iota(dims: list[int], perm: list[int] | None) -> np.ndarray:
    arr = np.arange(math.prod(dims)).reshape(dims)
    return arr.transpose(perm) if perm else arr


def _ints(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"-?\d+", text)]


def _parse_iota(text: str) -> np.ndarray:
    """``[2,4]T(1,0)`` → the device ids, in order (flattened)."""
    m = re.match(r"\[([\d,]*)\](?:T\(([\d,]*)\))?", text.strip())
    if not m:
        return np.array(_ints(text))
    dims = _ints(m.group(1))
    perm = _ints(m.group(2)) if m.group(2) else None
    return _iota(dims, perm).reshape(-1)


def bracketed(line: str, start: int, open_ch: str, close_ch: str) -> str:
    """The text from ``line[start]`` (an opening bracket) to its matching close, inclusive."""
    depth = 0
    for i in range(start, len(line)):
        if line[i] == open_ch:
            depth += 1
        elif line[i] == close_ch:
            depth -= 1
            if depth == 0:
                return line[start : i + 1]
    return line[start:]


def parse_groups(line: str, num_devices: int) -> list[list[int]]:
    """The device groups of a collective's HLO line (``[]`` if it has none)."""
    pos = line.find("replica_groups=")
    if pos < 0:
        return []
    rest = line[pos + len("replica_groups=") :]
    if rest.startswith("{"):
        body = bracketed(rest, 0, "{", "}")
        listed = [_ints(g) for g in re.findall(r"\{([\d,\s]*)\}", body[1:-1])]
        listed = [g for g in listed if g]
        return listed or [list(range(num_devices))]
    if rest.startswith("["):
        m = re.match(r"\[(\d+),(\d+)\]<=(\[[\d,]*\](?:T\([\d,]*\))?)", rest)
        if m:
            ids = _parse_iota(m.group(3))
            groups: list[list[int]] = ids.reshape(int(m.group(1)), int(m.group(2))).tolist()
            return groups
        return []
    if rest.startswith("mesh["):
        return _mesh_groups(rest)
    return []


def _mesh_groups(rest: str) -> list[list[int]]:
    """Groups of XLA's mesh form: ``mesh['a'=4,'b'=2], device_ids=(...) {'a'}``."""
    head = bracketed(rest, 4, "[", "]")
    axes = [(n, int(s)) for n, s in re.findall(r"'([^']+)'=(\d+)", head)]
    after = rest[4 + len(head) :]
    size = math.prod(s for _, s in axes)
    ids = np.arange(size)
    dev = re.match(r"\s*,\s*device_ids=", after)
    if dev:
        body = bracketed(after, dev.end(), "(", ")")
        ids = _parse_iota(body[1:-1])
        after = after[dev.end() + len(body) :]
    sel_body = re.match(r"\s*(\{[^}]*\})", after)
    selected: dict[str, tuple[int, int] | None] = {}
    if sel_body:
        for name, pre, sub in re.findall(r"'([^']+)'(?::\((\d+)\)(\d+))?", sel_body.group(1)):
            selected[name] = (int(pre), int(sub)) if pre else None
    factors: list[int] = []
    chosen: list[int] = []
    for name, n in axes:
        if name in selected and selected[name] is not None:
            pre, sub = selected[name]  # type: ignore[misc]
            factors += [pre, sub, n // (pre * sub)]
            chosen.append(len(factors) - 2)
        else:
            factors.append(n)
            if name in selected:
                chosen.append(len(factors) - 1)
    grid = ids.reshape(factors)
    others = [i for i in range(len(factors)) if i not in chosen]
    group_size = math.prod(factors[i] for i in chosen)
    groups: list[list[int]] = grid.transpose(others + chosen).reshape(-1, group_size).tolist()
    return groups


def axes_of_groups(groups: list[list[int]], mesh_shape: dict[str, int]) -> tuple[str, ...]:
    """The mesh axes along which members of the groups differ, in mesh order."""
    names = list(mesh_shape)
    dims = [mesh_shape[n] for n in names]
    varying: set[int] = set()
    for group in groups:
        coords = np.array(np.unravel_index(np.array(group), dims)).T
        for axis in range(len(dims)):
            if len(set(coords[:, axis].tolist())) > 1:
                varying.add(axis)
    return tuple(names[a] for a in sorted(varying))


def collective_groups(kind: str, line: str, num_devices: int) -> list[list[int]]:
    """The device groups of a collective of ``kind`` from its HLO ``line`` (a permute's pairs
    of devices that exchange data)."""
    if kind == "collective-permute":
        return [p for p in _pairs(line) if p[0] != p[1]]
    return parse_groups(line, num_devices)


def _pairs(line: str) -> list[list[int]]:
    pos = line.find("source_target_pairs=")
    if pos < 0:
        return []
    body = bracketed(line, pos + len("source_target_pairs="), "{", "}")
    return [_ints(p) for p in re.findall(r"\{(\d+,\d+)\}", body)]


def _table(text: str, title: str) -> dict[int, str]:
    """One of the numbered tables at the top of HLO text (``FileNames``, ``StackFrames``, …)."""
    out: dict[int, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if line.strip() == title:
            for row in lines:
                m = re.match(r"\s*(\d+)\s+(.*)", row)
                if not m:
                    break
                out[int(m.group(1))] = m.group(2)
            break
    return out


def _unescaped(text: str) -> str:
    r"""``text`` as XLA's tables escape it, C's way (``f\303\274n`` for ``fün``), read back.

    >>> _unescaped(r"f\303\274n"), _unescaped("plain")
    ('fün', 'plain')
    """
    if "\\" not in text:
        return text
    try:
        return text.encode("ascii").decode("unicode_escape").encode("latin-1").decode("utf-8")
    except UnicodeError:
        return text


def stack_frames(hlo_text: str) -> dict[int, str]:
    """``stack_frame_id`` → ``"file.py:12 (function)"``, from the tables XLA prints."""
    files = {k: _unescaped(v.strip('"')) for k, v in _table(hlo_text, "FileNames").items()}
    funcs = {k: _unescaped(v.strip('"')) for k, v in _table(hlo_text, "FunctionNames").items()}
    locations = {}
    for k, v in _table(hlo_text, "FileLocations").items():
        fields = dict(re.findall(r"(\w+)=(\d+)", v))
        file = files.get(int(fields.get("file_name_id", 0)), "?")
        func = funcs.get(int(fields.get("function_name_id", 0)), "")
        where = f"{file}:{fields.get('line', '?')}"
        locations[k] = f"{where} ({func})" if func else where
    frames = {}
    for k, v in _table(hlo_text, "StackFrames").items():
        m = re.search(r"file_location_id=(\d+)", v)
        if m and int(m.group(1)) in locations:
            frames[k] = locations[int(m.group(1))]
    return frames


def collectives(hlo_text: str, mesh_shape: dict[str, int]) -> list[Collective]:
    """Every collective in compiled HLO text, with its groups named by mesh axes.

    Args:
        hlo_text: ``compiled.as_text()`` of an SPMD-partitioned program.
        mesh_shape: the user's mesh, axis name → size, in mesh order.

    >>> line = "%ar = f32[2000]{0} all-reduce(%x), replica_groups=[2,4]<=[8], to_apply=%add"
    >>> [c.to_json() for c in collectives(line, {"x": 2, "y": 4})]
    [{'kind': 'all-reduce', 'mesh_axes': ['y'], 'bytes': 8000}]
    """
    num_devices = math.prod(mesh_shape.values())
    frames, roots = stack_frames(hlo_text), _roots(hlo_text)
    found = []
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        kind: CollectiveKind = m.group("kind")  # type: ignore[assignment]
        sizes = _array_bytes(m.group("type"))
        if m.group("start") and kind in ("all-gather", "collective-permute") and len(sizes) > 1:
            nbytes = sizes[1]
        else:
            nbytes = sum(sizes)
        groups = collective_groups(kind, line, num_devices)
        op = _OP_NAME.search(line)
        src = _SOURCE.search(line)
        frame = _FRAME.search(line)
        if src:
            source = f"{src.group(1)}:{src.group(2)}"
        else:
            source = frames.get(int(frame.group(1)), "") if frame else ""
        found.append(
            Collective(
                kind=kind,
                mesh_axes=axes_of_groups(groups, mesh_shape),
                bytes=nbytes,
                groups=tuple(tuple(g) for g in groups),
                hlo_name=m.group("name"),
                op_name=op.group(1) if op else "",
                source=source,
                shape=_result_shape(m.group("type"), bool(m.group("start")), kind),
                combiner=roots.get(applied.group(1), "")
                if (applied := _APPLY.search(line))
                else "",
            )
        )
    return found
