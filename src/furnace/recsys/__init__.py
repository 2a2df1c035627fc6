"""Pattern-aware sparse communication for recommendation-model training (He, Chen, Zhai,
PPoPP '24 poster; design note `recsys.md`): DLRM with row-granular hybrid parallelism, where a
performance model picks the embedding rows to replicate within a memory budget, the rest are
sharded by row with deduplicated, scheduled exchanges, beside the baselines it replaces.

Public API:
    data:      DataConfig, SyntheticClickLog, CriteoTSVReader, write_criteo_tsv, access_counts
    model:     ModelConfig, DLRM, OptimizerConfig, ReferenceTrainer (the single-process reference)
    plan:      ShardingPlan, make_plan, choose_hot_set, brute_force_hot_set, ClusterModel,
               expected_phase_bytes, iteration_time
    engine:    EngineConfig, ShardedTrainer, exact_bytes
    runs:      RecsysTrainConfig, train_recsys, BenchConfig, run_bench, plan_report
"""

from .accounting import exact_bytes
from .batch import Batch
from .bench import BenchConfig, BenchResult, run_bench
from .compare import PlanReport, plan_report
from .config import (
    CRITEO_KAGGLE_ROWS,
    SCHEMES,
    SPARSE_OPTIMIZERS,
    DataConfig,
    DataError,
    EngineConfig,
    ModelConfig,
    OptimizerConfig,
    PlanError,
    ShardingPlan,
    scaled_table_rows,
)
from .data import CriteoTSVReader, SyntheticClickLog, access_counts, write_criteo_tsv
from .engine import ShardedTrainer
from .model import DLRM
from .naive import ReferenceTrainer, roc_auc
from .perfmodel import ClusterModel, expected_phase_bytes, iteration_time
from .plan import HotSetChoice, brute_force_hot_set, choose_hot_set, make_plan
from .train import RecsysTrainConfig, RecsysTrainResult, train_recsys

__all__ = [
    "Batch", "BenchConfig", "BenchResult", "CRITEO_KAGGLE_ROWS", "ClusterModel",
    "CriteoTSVReader", "DLRM", "DataConfig", "DataError", "EngineConfig", "HotSetChoice",
    "ModelConfig", "OptimizerConfig", "PlanError", "PlanReport", "RecsysTrainConfig",
    "RecsysTrainResult", "ReferenceTrainer", "SCHEMES", "SPARSE_OPTIMIZERS", "ShardedTrainer",
    "ShardingPlan", "SyntheticClickLog", "access_counts", "brute_force_hot_set",
    "choose_hot_set", "exact_bytes", "expected_phase_bytes", "iteration_time", "make_plan",
    "plan_report", "roc_auc", "run_bench", "scaled_table_rows", "train_recsys",
    "write_criteo_tsv",
]
