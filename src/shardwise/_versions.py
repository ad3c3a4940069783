"""What differs between the JAX releases shardwise supports, handled in one place.

shardwise is tested on the oldest and the newest JAX that pip serves here (see the README) and
supports, by reading their changelogs and sources, the releases up to the newest it names.
Every difference it must bridge between them is a function here; the rest of the code calls
these and never asks for a version itself.
"""

from __future__ import annotations

import contextlib
import math
import os
import site
from collections.abc import Iterator
from typing import Any

import jax
import jax.extend.core as jcore
import numpy as np
from jax._src import core as jax_core
from jax._src import mesh as _mesh_lib
from jax._src import source_info_util
from jax._src import util as _jax_util
from jax._src.interpreters import partial_eval as _partial_eval
from jax._src.lib import version as _jaxlib_version
from jax.sharding import Mesh

_JAXLIB: tuple[int, ...] = tuple(_jaxlib_version)
"""The installed jaxlib's version: its XLA's behaviour differs where JAX's API does not
(read from jaxlib itself, so a jaxlib without package metadata imports as well)."""

DropVar: type = getattr(jcore, "DropVar", None) or jax_core.DropVar
"""The jaxpr variable of a result nobody reads (public in ``jax.extend.core`` from 0.10)."""


def keys(dtype: Any, shape: tuple[int, ...]) -> jax.Array:
    """PRNG keys of the key dtype ``dtype`` (its generator) and ``shape``.

    >>> keys(jax.random.key(0).dtype, (2, 3)).shape
    (2, 3)
    """
    impl = dtype._impl  # the generator a key dtype stands for (no public accessor)
    flat = jax.random.split(jax.random.key(0, impl=impl), math.prod(shape))
    return flat.reshape(shape)


def scan_counts(params: Any) -> tuple[int, int]:
    """How many of a ``scan`` equation's operands are constants and how many carries (the
    rest are the stacks it slices): ``num_consts``/``num_carry`` up to JAX 0.10, the lengths
    of the flattened trees ``ft_in`` holds from 0.11.

    >>> import jax.numpy as jnp
    >>> step = lambda c, x: (c + x.sum(), x * c)
    >>> jaxpr = jax.make_jaxpr(lambda c, xs: jax.lax.scan(step, c, xs))(1.0, jnp.ones((4, 3)))
    >>> scan_counts(jaxpr.eqns[-1].params)
    (0, 1)
    """
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = (list(part) for part in params["ft_in"].unpack())
    return len(consts), len(carry)


def combined_names_every_part() -> bool:
    """Whether XLA names a collective it combined from several after every part
    (``jit(f)/(jvp()/reduce_sum:transpose(jvp())/dot_general)``, from the XLA of jaxlib 0.10)
    or after the first part alone (``jit(f)/jvp()/reduce_sum``, jaxlib 0.9)."""
    return _JAXLIB[:2] >= (0, 10)


def cpu_fuses_transposed_dots() -> bool:
    """Whether XLA's CPU backend fuses a dot contracted over its left operand's first
    dimensions (``x.T @ w``, ``einsum('kn,kd->nd', x, w)``) into the one reduction that reads
    it, as it fuses ``x @ w``: from jaxlib 0.12.1 (measured on 8 CPU devices:
    ``(x.T @ w).sum(-1)`` of ``f32[512, 2048]`` and ``f32[512, 1024]`` holds the dot's 8 MiB
    as a temporary on jaxlib 0.10.2, 0.11.0 and 0.12.0, none on 0.12.1)."""
    return _JAXLIB >= (0, 12, 1)


def moves_named_after_operand() -> bool:
    """Whether XLA names the first collective of a layout change after the op that laid out
    the array it moves (the constraint it leaves), not after the constraint that asks for the
    new layout. Measured on an MLP training step's cotangent, laid out at the loss's line
    (``models.py:81``) and gathered for a dot at ``models.py:44``: from the same lowered
    program, jaxlib 0.12.1 names the all-gather after ``models.py:81``, jaxlib 0.10.2 after
    ``models.py:44``; and on 0.12.1 a carry gathered for a dot in a scan's body after the
    scan's line, where the body takes it. jaxlib 0.11.x and 0.12.0 were not measured (not
    installable here): the switch is at 0.11, from which XLA names the change of an
    argument's layout after the argument (``args[1]``; ``attribution._ops``), the same
    rule for an array that no op laid out."""
    return _JAXLIB[:2] >= (0, 11)


def heap_release() -> tuple[int, int, int]:
    """The jaxlib release, of those the tests' figures of XLA's heap were measured on (0.10.2,
    0.11.0, 0.12.0, 0.12.1), whose XLA places a CPU program's buffers in its heap as the
    installed one does: where only that placement differs, not the bytes the model predicts
    to be live. Measured: the GPT's attention split along each head's features leaves gaps
    between its score buffers up to jaxlib 0.12.0 (the searched plan 1.36x its prediction:
    on 0.10.2 a heap of 131072 bytes for 86016 live at once, ``benchmarks/xla_heap.py``), not
    on 0.12.1 (98304 for 83968: 1.09x); a 13 KB cond step's plans hold 512 bytes more from
    0.12.0 (its FSDP plan 1.24x, 1.19x before); a BatchNorm step's FSDP plan is at 0.69x on
    0.12.1 (0.76x before) and its data x tensor plan within 20% (1.31x before). 0.11.0 places
    them as 0.10.2."""
    for release in ((0, 12, 1), (0, 12, 0)):
        if release <= _JAXLIB:
            return release
    return (0, 10, 2)


def halves_cpu_computes_in_float32() -> frozenset[str]:
    """The 16-bit float types XLA's CPU backend computes in float32 (its float normalization
    converts an op's 16-bit operands to float32 buffers and computes the op there). Measured
    in the compiled HLO of two bfloat16 layers on 8 CPU devices: jaxlib 0.10.2 and 0.11.0
    compute bfloat16 and float16 so, each bfloat16 dot reading float32 copies of its operands
    (``f32[64,256] convert(w1)``) and making float32, a sort too (192 KiB of temporaries);
    jaxlib 0.12.0 and 0.12.1 compute bfloat16 as it is, its dots in YNNPACK
    (``bf16[64,256] __ynn_fusion(x, w1)``, no convert: 40 KiB), and so the arrays the dots
    read and make, and a sort, but float16 still in float32. On all four, bfloat16's
    collectives (all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute) run
    in float32, as do its convolutions and a 2-D dot whose operand's transpose XLA folds
    into it (``x.T @ w``)."""
    if _JAXLIB[:2] >= (0, 12):
        return frozenset({"float16"})
    return frozenset({"bfloat16", "float16"})


def varying_axes(value: Any) -> frozenset[Any]:
    """The manual mesh axes ``value`` varies over inside ``shard_map`` (its type's
    ``manual_axis_type.varying`` from JAX 0.10, ``vma`` before)."""
    aval = jax.typeof(value)
    manual = getattr(aval, "manual_axis_type", None) or getattr(aval, "mat", None)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", frozenset()))


def live_only(closed: Any) -> Any:
    """The traced program ``closed`` without the equations whose results nothing reads
    (those with effects, a print or a callback, are kept), as XLA removes them when it
    compiles: ``jax.grad(loss)`` leaves the loss's own sum in the trace, unread. Every
    argument is kept. (``dce_jaxpr`` is JAX's own pass, the same from 0.4 to 0.12.)

    >>> f = lambda x: jax.grad(lambda x: (x * x).sum())(x)
    >>> closed = jax.make_jaxpr(f)(jax.numpy.ones(3))
    >>> [e.primitive.name for e in live_only(closed).eqns]
    ['broadcast_in_dim', 'mul', 'mul', 'add_any']
    """
    jaxpr, _ = _partial_eval.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), True)
    return jcore.ClosedJaxpr(jaxpr, closed.consts)


def context_mesh() -> Mesh | None:
    """The mesh set by ``jax.set_mesh`` (as a context or for the whole process), or ``None``;
    inside ``jax.jit`` too, where ``jax.sharding.get_mesh`` refuses and JAX keeps it as
    ``jax._src.mesh.get_concrete_mesh()`` (0.7 to 0.12).

    >>> context_mesh() is None
    True
    """
    found: Any
    try:
        found = jax.sharding.get_mesh()
    except ValueError:  # inside jax.jit, where the public API gives only the abstract mesh
        concrete = getattr(_mesh_lib, "get_concrete_mesh", None)
        found = concrete() if concrete is not None else None
    return found if isinstance(found, Mesh) and not found.empty else None


@contextlib.contextmanager
def sources_in_users_code() -> Iterator[None]:
    """Within: JAX takes an op's source line to be the first frame of the user's own code,
    outside installed packages (Flax, Equinox, Haiku, optax) and shardwise, where it would
    take the first frame outside JAX (``linear.py:422`` for every Flax layer's dot). Both the
    program planner's names and the compiled program's metadata read it, so they agree.
    shardwise's built-in models count as the user's code: they are the program planned."""
    info = source_info_util
    # JAX keeps what it traced of a jitted function (softmax, take, a Flax layer) and reuses
    # it under the same mesh: its ops would keep the lines of the program that traced it
    # first (planning two models in one process). Its staging caches are emptied so that
    # every op here is traced anew, with the lines of this program (the executables of the
    # user's jitted calls, in JAX's C++ caches, are kept).
    clear_staging = getattr(_jax_util, "clear_all_caches", None)
    if clear_staging is not None:
        clear_staging()
    excluded = [p for p in _library_paths() if p not in info._exclude_paths]
    included = [p for p in _BUILT_IN_MODELS if p not in info._include_paths]
    for path in excluded:
        info.register_exclusion(path)
    for path in included:
        info.register_inclusion(path)
    info.user_frame.cache_clear()
    try:
        yield
    finally:
        for path in excluded:
            info._exclude_paths.remove(path)
        for path in included:
            info._include_paths.remove(path)
        info._exclude_path_regex.cache_clear()
        info._include_path_regex.cache_clear()
        info.is_user_filename.cache_clear()
        info.user_frame.cache_clear()


_BUILT_IN_MODELS = tuple(
    os.path.join(os.path.dirname(__file__), "_program", name)
    for name in ("models.py", "llama.py", "flash.py", "optimizers.py")
)


def _library_paths() -> tuple[str, ...]:
    """Where installed packages and shardwise itself live, each ending in a separator."""
    found = [*site.getsitepackages(), site.getusersitepackages(), os.path.dirname(__file__)]
    return tuple(dict.fromkeys(os.path.join(p, "") for p in found if p))


def literal_here(value: Any) -> Any:
    """A jaxpr literal's value, its type made anew where it is bound: JAX 0.10 keeps a traced
    literal's type with the mesh it was traced under (an abstract mesh the plan traced on),
    and binding it beside arrays on the devices' mesh fails ("Mesh for all inputs should be
    equal": ``jax.random.fold_in(key, 7)``, as Flax's dropout calls it, on a key the previous
    step made). Other values, and earlier JAX's literals, are as they are."""
    aval = getattr(value, "aval", None)
    if not isinstance(value, np.ndarray) or aval is None:
        return value
    try:
        fresh = jax_core.ShapedArray(value.shape, value.dtype, weak_type=aval.weak_type)
        return type(value)(np.asarray(value), fresh)
    except TypeError:  # (a later JAX's literal takes no type: it makes its own)
        return value
