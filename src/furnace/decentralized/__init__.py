"""Prague: heterogeneity-aware asynchronous decentralized training with Partial All-Reduce
(Luo, He, Zhuo, Qian, ASPLOS '20), reconstructed from the abstract and design note
`prague.md` (the paper body was not available; see README.md for what is reconstructed).

Public API:

* `RunConfig`, `PolicyConfig`, `HeteroConfig` (config), `MODES`, `POLICIES`, `BACKENDS`;
* `run`, `run_series`, `run_on_world`, `RunResult`, `trace_timeline` (train);
* `GroupGenerator`, `GeneratorServer`, `GeneratorClient`, `Group` (generator);
* `P2PLeaderPReduce`, `CachedGlooPReduce`, `PrecreatedPReduce`, `make_backend` (preduce);
* `mixing` (W_G, rho, consensus distance), `simulate` (the discrete-event simulator),
  `naive` (the single-process reference).
"""

from .config import BACKENDS, MODES, POLICIES, TASKS, HeteroConfig, PolicyConfig, RunConfig
from .generator import GeneratorClient, GeneratorServer, Group, GroupGenerator, GroupTimeoutError
from .preduce import CachedGlooPReduce, P2PLeaderPReduce, PrecreatedPReduce, make_backend
from .train import RunResult, run, run_on_world, run_series, trace_timeline

__all__ = ["BACKENDS", "MODES", "POLICIES", "TASKS", "CachedGlooPReduce", "GeneratorClient",
           "GeneratorServer", "Group", "GroupGenerator", "GroupTimeoutError", "HeteroConfig",
           "P2PLeaderPReduce", "PolicyConfig", "PrecreatedPReduce", "RunConfig", "RunResult",
           "make_backend", "run", "run_on_world", "run_series", "trace_timeline"]
