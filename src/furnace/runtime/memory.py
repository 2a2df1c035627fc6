"""Peak memory of one call, measured in a fresh child process.

The measurement is part of the timing harness, `furnace.runtime.timing`
(`measure_in_subprocess`: the child resets the kernel's resident-set high-water mark,
runs the call, and reports VmHWM minus the resident size it started from). This module
keeps the name the eigensolver and kernel benchmarks import it by.
"""

from __future__ import annotations

from .timing import Measured, measure_in_subprocess

__all__ = ["Measured", "measure_in_subprocess"]
