"""shardwise: plan, see and trust tensor parallelism in JAX.

Build a mesh of devices with named axes, say how each operand is split, and run
an einsum or any JAX function sharded that way; ask what each device holds and
which collectives XLA inserted.

>>> import shardwise
>>> shardwise.explain_einsum("nd,nd->n", [(8, 4)] * 2, mesh="devices=8",
...                          in_specs=["devices", "devices"]).collectives
()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardwise._runtime.devices import apply_env as _apply_env
from shardwise._runtime.distributed import DistributedError
from shardwise._runtime.distributed import initialize_from_env as _join_from_env

if TYPE_CHECKING:
    from shardwise._api import Sharded as Sharded
    from shardwise._api import einsum as einsum
    from shardwise._api import explain as explain
    from shardwise._api import explain_einsum as explain_einsum
    from shardwise._api import mean as mean
    from shardwise._api import shard as shard
    from shardwise._data.stream import StreamResult as StreamResult
    from shardwise._data.stream import stream as stream
    from shardwise._errors import ArgumentError as ArgumentError
    from shardwise._errors import EquationError as EquationError
    from shardwise._errors import IndivisibleError as IndivisibleError
    from shardwise._errors import MeshError as MeshError
    from shardwise._errors import MiscompileError as MiscompileError
    from shardwise._errors import ShapeError as ShapeError
    from shardwise._errors import ShardwiseError as ShardwiseError
    from shardwise._errors import SpecError as SpecError
    from shardwise._model.mesh import MeshSpec as MeshSpec
    from shardwise._model.mesh import mesh as mesh
    from shardwise._model.op import Op as Op
    from shardwise._model.plan import Plan as Plan
    from shardwise._model.spec import Layout as Layout
    from shardwise._model.spec import Spec as Spec
    from shardwise._runtime.devices import use_cpu_devices as use_cpu_devices
    from shardwise._runtime.distributed import DistributedError as DistributedError
    from shardwise._runtime.distributed import initialize as initialize_distributed
    from shardwise._xla.cause import Cause as Cause
    from shardwise._xla.explain import Explanation as Explanation
    from shardwise._xla.hlo import Collective as Collective

# Public names resolve on first use (PEP 562), so `import shardwise` does not import JAX
# unless the environment asks for simulated devices or a distributed runtime, and
# `shardwise launch` starts its processes without paying for a JAX import itself.
_EXPORTS = {
    "Sharded": ("shardwise._api", "Sharded"),
    "einsum": ("shardwise._api", "einsum"),
    "explain": ("shardwise._api", "explain"),
    "explain_einsum": ("shardwise._api", "explain_einsum"),
    "mean": ("shardwise._api", "mean"),
    "shard": ("shardwise._api", "shard"),
    "Cause": ("shardwise._xla.cause", "Cause"),
    "use_cpu_devices": ("shardwise._runtime.devices", "use_cpu_devices"),
    "DistributedError": ("shardwise._runtime.distributed", "DistributedError"),
    "initialize_distributed": ("shardwise._runtime.distributed", "initialize"),
    "ArgumentError": ("shardwise._errors", "ArgumentError"),
    "EquationError": ("shardwise._errors", "EquationError"),
    "IndivisibleError": ("shardwise._errors", "IndivisibleError"),
    "MeshError": ("shardwise._errors", "MeshError"),
    "MiscompileError": ("shardwise._errors", "MiscompileError"),
    "ShapeError": ("shardwise._errors", "ShapeError"),
    "ShardwiseError": ("shardwise._errors", "ShardwiseError"),
    "SpecError": ("shardwise._errors", "SpecError"),
    "Explanation": ("shardwise._xla.explain", "Explanation"),
    "Collective": ("shardwise._xla.hlo", "Collective"),
    "MeshSpec": ("shardwise._model.mesh", "MeshSpec"),
    "mesh": ("shardwise._model.mesh", "mesh"),
    "Op": ("shardwise._model.op", "Op"),
    "Plan": ("shardwise._model.plan", "Plan"),
    "Layout": ("shardwise._model.spec", "Layout"),
    "Spec": ("shardwise._model.spec", "Spec"),
    "StreamResult": ("shardwise._data.stream", "StreamResult"),
    "stream": ("shardwise._data.stream", "stream"),
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardwise' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "Cause",
    "Collective",
    "DistributedError",
    "EquationError",
    "Explanation",
    "IndivisibleError",
    "Layout",
    "MeshError",
    "MeshSpec",
    "MiscompileError",
    "Op",
    "Plan",
    "ShapeError",
    "Sharded",
    "ShardwiseError",
    "Spec",
    "SpecError",
    "StreamResult",
    "einsum",
    "explain",
    "explain_einsum",
    "initialize_distributed",
    "mean",
    "mesh",
    "shard",
    "stream",
    "use_cpu_devices",
]

_apply_env()
try:
    _join_from_env()
except DistributedError as _e:  # the environment asked to join a runtime; failing is fatal
    import sys as _sys

    _sys.stderr.write(f"error: {_e}\n")
    raise SystemExit(2) from None
