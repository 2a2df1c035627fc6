"""DeltaFormer (Xu, Ao, He, Lu, Shi, Zhong, NeurIPS 2025): attention whose values are replaced by
u_t = alpha_t v_t - beta_t sum_{i<t} kappa1(w_t, k_i) u_i (Sec. 3.2), computed chunk-wise
(Sec. 3.4) against a literal token-loop reference.
"""

from .chunk import deltaformer_chunk, deltaformer_u
from .model import (
    DecoderBlock,
    DeltaFormerAttention,
    DeltaFormerLM,
    KUCache,
    LMConfig,
    SequenceModel,
    TransformerLM,
)
from .naive import KAPPA1_KINDS, deltaformer_naive
from .train import (
    CheckpointError,
    CheckpointExistsError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    DeltaFormerTrainResult,
    TrainConfig,
    TrainResult,
    train,
)

__all__ = [
    "KAPPA1_KINDS",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "DecoderBlock",
    "DeltaFormerAttention",
    "DeltaFormerTrainResult",
    "DeltaFormerLM",
    "KUCache",
    "LMConfig",
    "SequenceModel",
    "TrainConfig",
    "TrainResult",
    "TransformerLM",
    "deltaformer_chunk",
    "deltaformer_naive",
    "deltaformer_u",
    "train",
]
