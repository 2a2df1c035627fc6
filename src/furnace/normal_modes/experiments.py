"""`furnace reproduce normal_modes`: nothing of its own; see `furnace reproduce eigen`.

The reproductions of Shi et al. (SC'18) and of the SC19 teams' runs exercise this package
and `furnace.eigen` together (accuracy against Lamb, the solver against ARPACK and LOBPCG on
the ball, the Mars DWAK modes and maps, the scaling study), so they are registered once, in
`furnace.eigen.experiments`, and reported under ``eigen``.
"""

from __future__ import annotations

REPORTED_UNDER = "eigen"
EXPERIMENTS: list = []
