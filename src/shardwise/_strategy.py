"""Enumerate index layouts: every way to give each mesh axis to at most one einsum index.

Pure functions; no devices needed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

from shardwise._mesh import MeshSpec
from shardwise._spec import Layout


def layouts(indices: str, sizes: Mapping[str, int], mesh: MeshSpec) -> Iterator[Layout]:
    """Every layout in which each mesh axis splits at most one index, evenly.

    An index may take several axes (in mesh order); an axis may be left unused
    (the data are replicated along it). There are ``(len(indices) + 1) ** len(mesh.axes)``
    assignments before the divisibility filter.

    >>> [lay.describe() for lay in layouts("nd", {"n": 4, "d": 3}, MeshSpec.parse("x=2"))]
    ['replicated', 'n=x']
    """
    choices = [None, *indices]
    for pick in itertools.product(choices, repeat=len(mesh.axes)):
        assignment: dict[str, tuple[str, ...]] = {}
        for (axis, _), index in zip(mesh.axes, pick, strict=True):
            if index is not None:
                assignment[index] = (*assignment.get(index, ()), axis)
        shards = {i: 1 for i in indices}
        for index, axes in assignment.items():
            for axis in axes:
                shards[index] *= mesh.shape[axis]
        if all(sizes[i] % shards[i] == 0 for i in indices):
            yield Layout(tuple(sorted(assignment.items())))
