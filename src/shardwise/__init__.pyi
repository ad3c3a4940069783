# The public surface of shardwise, listed once. `__init__.py` reads this file to load each
# name on first use (lazy_loader.attach_stub), and type checkers read it as the package's
# types; tests/test_architecture.py checks that the two agree.

from ._api import einsum as einsum
from ._api import explain as explain
from ._api import explain_einsum as explain_einsum
from ._api import mean as mean
from ._api import plan_einsum as plan_einsum
from ._caches import clear_caches as clear_caches
from ._data.result import StreamResult as StreamResult
from ._data.stream import stream as stream
from ._errors import ArgumentError as ArgumentError
from ._errors import ArgumentTypeError as ArgumentTypeError
from ._errors import DistributedError as DistributedError
from ._errors import EquationError as EquationError
from ._errors import IndivisibleError as IndivisibleError
from ._errors import MeshError as MeshError
from ._errors import MiscompileError as MiscompileError
from ._errors import MissingExtraError as MissingExtraError
from ._errors import ShapeError as ShapeError
from ._errors import ShardwiseError as ShardwiseError
from ._errors import ShardwiseWarning as ShardwiseWarning
from ._errors import SpecError as SpecError
from ._errors import UserCodeError as UserCodeError
from ._model.mesh import MeshSpec as MeshSpec
from ._model.mesh import mesh as mesh
from ._model.op import Op as Op
from ._model.plan import Plan as Plan
from ._model.spec import Layout as Layout
from ._model.spec import Spec as Spec
from ._planner.einsum import PlanReport as PlanReport
from ._program.device_sweep import DeviceSweep as DeviceSweep
from ._program.device_sweep import sweep_devices as sweep_devices
from ._program.mesh_search import MeshChoice as MeshChoice
from ._program.mesh_search import choose_mesh as choose_mesh
from ._program.models import model as model
from ._program.plans import ProgramPlan as ProgramPlan
from ._program.program import plan as plan
from ._program.sweep import Sweep as Sweep
from ._program.sweep import sweep as sweep
from ._runtime.devices import use_cpu_devices as use_cpu_devices
from ._runtime.distributed import initialize_distributed as initialize_distributed
from ._runtime.hostmem import keep_freed_memory_warm as keep_freed_memory_warm
from ._shard import Sharded as Sharded
from ._shard import shard as shard
from ._xla.cause import Cause as Cause
from ._xla.explain import Explanation as Explanation
from ._xla.hlo import Collective as Collective

__version__: str
