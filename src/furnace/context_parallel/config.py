"""Configs and errors of UltraAttn's context parallelism (Yang et al., SC'25).

Every error a user can cause is a `ConfigFieldError` (from `furnace.runtime.cliargs`): it
names the field and says what is allowed, so the CLI can turn it into one line naming its own
flag. The dataclasses below are the planner's and the benchmark's inputs.
"""

from __future__ import annotations

from furnace.runtime.cliargs import ConfigFieldError

__all__ = ["ConfigFieldError", "LayoutError", "MaskError", "PlanError"]


class MaskError(ConfigFieldError):
    """A mask that is not a FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``."""


class LayoutError(ConfigFieldError):
    """A layout that cannot hold the sequence, such as more ranks than blocks."""


class PlanError(ConfigFieldError):
    """A planner input that cannot be planned."""
