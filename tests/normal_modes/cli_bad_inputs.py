"""User mistakes `furnace modes` must reject with exit 2 and one line, before any meshing.

Read by the central CLI-contract test (tests/test_cli_contract.py) and by
tests/normal_modes/test_cli.py: each case is (case_id, argv after ``furnace``).
"""

from __future__ import annotations

from pathlib import Path

# the band by the ModesConfig field names; the short spellings --fmin/--fmax in two cases
_BAND = ["--fmin-mhz", "0.3", "--fmax-mhz", "0.6"]
_HERE = str(Path(__file__).resolve())  # a file that surely exists, to pass where a folder goes
_MISSING = "/nonexistent-furnace-folder"


def _modes(*args: str) -> list[str]:
    return ["modes", *args]


BAD_INPUTS: list[tuple[str, list[str]]] = [
    # the band
    ("modes-fmin-text", _modes("--fmin-mhz", "low", "--fmax-mhz", "0.6")),
    ("modes-fmin-zero", _modes("--fmin-mhz", "0", "--fmax-mhz", "0.6")),
    ("modes-fmin-negative", _modes("--fmin-mhz", "-0.1", "--fmax-mhz", "0.6")),
    ("modes-fmin-nan", _modes("--fmin-mhz", "nan", "--fmax-mhz", "0.6")),
    ("modes-fmax-negative", _modes("--fmin-mhz", "0.3", "--fmax-mhz", "-1")),
    ("modes-fmax-inf", _modes("--fmin-mhz", "0.3", "--fmax-mhz", "inf")),
    ("modes-fmin-above-fmax", _modes("--fmin-mhz", "0.6", "--fmax-mhz", "0.4")),
    ("modes-fmin-equals-fmax", _modes("--fmin-mhz", "0.5", "--fmax-mhz", "0.5")),
    ("modes-short-fmin-zero", _modes("--fmin", "0", "--fmax", "0.6")),
    ("modes-short-fmin-above-fmax", _modes("--fmin", "0.6", "--fmax", "0.4")),
    # the planet and its mesh
    ("modes-planet-unknown", _modes("--planet", "venus", *_BAND)),
    ("modes-mesh-size-zero", _modes(*_BAND, "--mesh-size", "0")),
    ("modes-mesh-size-negative", _modes(*_BAND, "--mesh-size", "-0.1")),
    ("modes-mesh-size-above-radius", _modes(*_BAND, "--mesh-size", "1.5")),
    ("modes-mesh-size-too-fine", _modes(*_BAND, "--mesh-size", "0.001")),
    ("modes-mesh-size-text", _modes(*_BAND, "--mesh-size", "fine")),
    ("modes-mesh-size-nan", _modes(*_BAND, "--mesh-size", "nan")),
    # element and fluid-core forms that do not exist
    ("modes-fluid-unknown", _modes("--planet", "mars", *_BAND, "--fluid", "coupled")),
    ("modes-fluid-on-ball", _modes("--planet", "ball", *_BAND, "--fluid", "split")),
    ("modes-p2-split-fluid", _modes("--planet", "mars", *_BAND, "--p2", "--fluid", "split")),
    # the solver's layout
    ("modes-slices-zero", _modes(*_BAND, "--slices", "0")),
    ("modes-slices-negative", _modes(*_BAND, "--slices", "-2")),
    ("modes-slices-text", _modes(*_BAND, "--slices", "two")),
    ("modes-mode-unknown", _modes(*_BAND, "--mode", "columns")),
    ("modes-group-size-zero", _modes(*_BAND, "--mode", "groups", "--group-size", "0")),
    ("modes-group-size-text", _modes(*_BAND, "--mode", "groups", "--group-size", "x")),
    ("modes-group-size-without-groups", _modes(*_BAND, "--mode", "rows", "--group-size", "2")),
    ("modes-groups-without-group-size", _modes(*_BAND, "--mode", "groups")),
    ("modes-group-size-exceeds-ranks", _modes(*_BAND, "--mode", "groups", "--group-size", "2")),
    # outputs
    ("modes-json-missing-folder", _modes(*_BAND, "--json", f"{_MISSING}/out.json")),
    ("modes-json-is-a-folder", _modes(*_BAND, "--json", str(Path(_HERE).parent))),
    ("modes-vtu-missing-folder", _modes(*_BAND, "--vtu", f"{_MISSING}/modes.vtu")),
    ("modes-vtu-is-a-folder", _modes(*_BAND, "--vtu", str(Path(_HERE).parent))),
    ("modes-plot-is-a-file", _modes(*_BAND, "--plot", _HERE)),
    ("modes-plot-under-a-file", _modes(*_BAND, "--plot", f"{_HERE}/maps")),
    ("modes-plot-not-creatable", _modes(*_BAND, "--plot", "/proc/furnace-maps")),
    ("modes-json-and-vtu-same-file", _modes(*_BAND, "--json", "/tmp/furnace-modes-same.out",
                                            "--vtu", "/tmp/furnace-modes-same.out")),
]
