"""Settings of one normal-mode computation (NormalModes' ``global_conf``, as a dataclass).

NormalModes (Shi et al., SC'18) reads the planet, the frequency band ``lowfreq``/``upfreq``
in mHz and ``pOrder`` from a config file; this is the same, validated, with this package's
choices (mesh size, mass lumping, fluid-core form, slices) beside them. Each field's
``metadata["help"]`` is the help of its `furnace modes` option.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PLANETS = ("ball", "mars", "prem", "moon")
FLUID_FORMS = ("split", "welded")


@dataclass(kw_only=True)
class ModesConfig:
    """What `compute_modes` computes.

    Args:
        planet: "ball" (CONST), "mars" (DWAK), "prem" or "moon".
        fmin_mhz, fmax_mhz: the band; fmin > 0 keeps the zero modes (rigid motions and
            divergence-free fluid motions) out.
        mesh_size: target edge length relative to the planet's radius.
        order: 1 (P1) or 2 (P2).
        lumped: row-sum lumped mass; None means True for P1, False for P2 (P2 row sums are
            not positive).
        fluid: "split" or "welded" fluid core; None means split for P1, welded for P2.
        slices: spectrum slices of the filtered Lanczos solver.
    """

    planet: str = field(default="ball", metadata={
        "help": "ball (CONST), mars (DWAK), prem or moon", "choices": PLANETS})
    fmin_mhz: float = field(metadata={
        "help": "lowest frequency in mHz, > 0 (keeps the zero modes out)"})
    fmax_mhz: float = field(metadata={"help": "highest frequency in mHz, > --fmin-mhz"})
    mesh_size: float = field(default=0.15, metadata={
        "help": "target edge length relative to the radius"})
    order: int = field(default=1, metadata={"help": "finite-element order: 1 (P1) or 2 (P2)",
                                            "choices": (1, 2)})
    lumped: bool | None = field(default=None, metadata={
        "help": "row-sum lumped mass (default: for P1, not for P2)"})
    fluid: str | None = field(default=None, metadata={
        "help": "fluid-core form, for planets with a fluid core (default: split for P1, "
        "welded for P2)", "choices": FLUID_FORMS})
    slices: int = field(default=1, metadata={"help": "spectrum slices"})

    def __post_init__(self) -> None:
        if self.planet not in PLANETS:
            raise ValueError(f"unknown planet {self.planet!r}; choose from {', '.join(PLANETS)}")
        if not 0 < self.fmin_mhz < self.fmax_mhz:
            raise ValueError(f"need 0 < fmin < fmax, got [{self.fmin_mhz}, {self.fmax_mhz}] mHz "
                             "(the interval must start above the zero modes)")
        if self.order not in (1, 2):
            raise ValueError(f"order must be 1 or 2, got {self.order}")
        if not 0 < self.mesh_size <= 1:
            raise ValueError(f"mesh_size is relative to the radius: need 0 < h <= 1, got "
                             f"{self.mesh_size}")
        if self.lumped is None:
            self.lumped = self.lumped_mass
        if self.lumped and self.order == 2:
            raise ValueError("row-sum lumping is only valid for P1; P2 needs consistent mass")
        if self.fluid is None:
            self.fluid = self.fluid_form
        if self.fluid not in FLUID_FORMS:
            raise ValueError(f"fluid must be one of {FLUID_FORMS}, got {self.fluid!r}")
        if self.fluid == "split" and self.order != 1:
            raise ValueError("the split-node fluid form is implemented for P1 only")
        if self.slices < 1:
            raise ValueError(f"slices must be >= 1, got {self.slices}")

    @property
    def lumped_mass(self) -> bool:
        """Whether the mass is lumped: ``lumped``, or the order's default where it is None."""
        return self.order == 1 if self.lumped is None else self.lumped

    @property
    def fluid_form(self) -> str:
        """The fluid-core form: ``fluid``, or the order's default where it is None."""
        if self.fluid is None:
            return "split" if self.order == 1 else "welded"
        return self.fluid
