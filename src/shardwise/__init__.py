"""shardwise: plan, see and trust tensor parallelism in JAX.

Build a mesh of devices with named axes, say how each operand is split, and run
an einsum or any JAX function sharded that way; ask what each device holds and
which collectives XLA inserted.

``import shardwise`` changes nothing in the process: it sets no environment variable,
starts no JAX backend, joins no runtime and touches no file descriptor; JAX is loaded only
when a name that needs it is first used (the names are listed once, in ``__init__.pyi``).

>>> import shardwise
>>> shardwise.explain_einsum("nd,nd->n", [(8, 4)] * 2, mesh="devices=8",
...                          in_specs=["devices", "devices"]).collectives
()
"""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach_stub(__name__, __file__)

__version__ = "0.1.0"
