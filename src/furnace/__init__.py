"""Furnace: eight research systems for large-scale AI training and HPC, as tested software.

Each system is a subpackage (`furnace.moe`, `furnace.eigen`, ...) built on the shared
`furnace.runtime`. The `furnace` command runs them; `furnace reproduce` reproduces the
papers' headline results into a report.
"""

__version__ = "0.1.0"
