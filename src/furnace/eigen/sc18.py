"""The SC'18 strong-scaling and fixed-interval runs of NormalModes on Stampede2 (cited data),
and the run as a `furnace.eigen.costmodel.Workload`.

The data are those of Shi, Li, Xi, Saad and de Hoop ("Computing planetary interior normal
modes with a highly parallel polynomial filtering eigensolver", SC'18, pp. 894-906) as
transcribed in ``thu-scc/SC19-NormalModes`` ``plot_result.py`` (design note
``eigensolver.md`` section 1.4); the per-A-matvec times come from the design note's
transcription (`SC18_MATVEC_SOURCE`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .costmodel import Workload

SC18_SOURCE = ("Shi, Li, Xi, Saad, de Hoop, SC'18 (Stampede2 SKX, 48 ranks/node), as "
               "transcribed in thu-scc/SC19-NormalModes plot_result.py")
# the per-A-matvec times are in the design note's transcription (eigensolver.md 1.4) but
# not in the copy of plot_result.py we could read, so they carry their own source
SC18_MATVEC_SOURCE = "Shi et al. SC'18 via design note eigensolver.md section 1.4"


@dataclass(frozen=True)
class StrongSeries:
    """One SC'18 strong-scaling series. ``efficiency`` is as transcribed (rounded);
    ``degree`` and ``filtered_matvecs`` come from the fixed-interval series entry of the
    same problem, whose total time equals this series' 384-process time."""

    name: str
    dofs: int
    processes: tuple[int, ...]
    seconds: tuple[float, ...]
    efficiency: tuple[float, ...]
    a_matvec_ms: tuple[float, ...]
    degree: int
    filtered_matvecs: int
    ranks_per_node: int = 48
    source: str = SC18_SOURCE


@dataclass(frozen=True)
class FixedIntervalSeries:
    """SC'18 "fixed interval" runs: one frequency band, growing mesh (plot_result.py)."""

    name: str
    dofs: tuple[int, ...]
    degree: tuple[int, ...]
    filtered_matvecs: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str = SC18_SOURCE


SC18_C3 = StrongSeries(
    name="C3 constant ball", dofs=3_894_783, processes=(192, 384, 768, 1536),
    seconds=(6854.54, 3247.78, 1779.14, 1259.08), efficiency=(1.0, 1.1, 0.96, 0.68),
    a_matvec_ms=(3.40, 1.74, 0.69, 0.36), degree=364, filtered_matvecs=672)
SC18_E3 = StrongSeries(
    name="E3 Earth", dofs=4_466_349, processes=(192, 384, 768),
    seconds=(34319.28, 16570.22, 10071.56), efficiency=(1.0, 1.0, 0.85),
    a_matvec_ms=(7.92, 4.90, 3.78), degree=1430, filtered_matvecs=652)
SC18_FIXED_CONST = FixedIntervalSeries(
    name="constant ball",
    dofs=(1038084, 2060190, 3894783, 7954392, 15809076, 31138518, 61381362, 120336519),
    degree=(271, 365, 364, 649, 869, 1062, 1330, 1566),
    filtered_matvecs=(652, 672, 672, 672, 672, 672, 672, 672),
    seconds=(2143.87, 3318.60, 3247.78, 6224.22, 7731.83, 9287.05, 11104.54, 13914.11))
SC18_FIXED_EARTH = FixedIntervalSeries(
    name="Earth",
    dofs=(1086702, 2265129, 4466349, 9037671, 17579616, 34115040, 66028227),
    degree=(585, 933, 1430, 1957, 2863, 3711, 4922),
    filtered_matvecs=(612, 632, 652, 652, 652, 652, 652),
    seconds=(5369.784, 10083.951, 16570.223, 24614.738, 37793.401, 44962.119, 63054.411))


# A nonzeros per row of the SC'18 pencil, P1 vector elasticity on tetrahedra: each row
# couples the 3 components of a vertex and of its edge neighbours, 3 (1 + 2 E / V) per row
# for V vertices and E edges. 43.7 is that of our gmsh unit ball at h = 0.05 (82,863
# unknowns; checked by tests/normal_modes/test_mesh.py). The consistent mass couples only
# equal components: exactly 1/3 of A's nonzeros.
SC18_NNZ_A_PER_ROW = 43.7
SC18_NNZ_M_PER_ROW = SC18_NNZ_A_PER_ROW / 3.0


def sc18_workload(series: StrongSeries, *, nnz_a_per_row: float, nnz_m_per_row: float,
                  allreduces_per_step: float, reorth_flops_per_nk2: float,
                  mass_degree: int = 25) -> Workload:
    """The SC'18 run as a `Workload`: deg x its A-matvecs, each followed by a degree-25
    Chebyshev mass solve (NormalModes, P1), with the sparsity of a P1 vector pencil
    (`SC18_NNZ_A_PER_ROW`) and the dots per Lanczos step and reorthogonalisation constant
    of our own runs."""
    n = series.dofs
    steps = series.filtered_matvecs
    a_matvecs = float(series.degree * steps)
    return Workload(n=n, nnz_a=nnz_a_per_row * n, nnz_m=nnz_m_per_row * n,
                    a_matvecs=a_matvecs, m_matvecs=mass_degree * a_matvecs,
                    allreduces=allreduces_per_step * steps,
                    reorth_flops=reorth_flops_per_nk2 * n * steps**2,
                    filter_degree=series.degree, filtered_matvecs=steps)
