"""The selector: Ape's range rule, cheapest-first escalation, explanations and failures."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.emulation import naive
from furnace.emulation.apps import APPS, get_app
from furnace.emulation.dsa import DSA
from furnace.emulation.selector import (
    NoTypeMeetsRequirement,
    PerTileType,
    select_type,
    type_matmul,
)
from furnace.emulation.types import get_type


def test_fp16_type_for_narrow_range_bf16_type_beyond_it():
    narrow = select_type(get_app("gemm-narrow", "tiny"), profile="a100")
    wide = select_type(get_app("gemm-wide", "tiny"), profile="a100")
    assert narrow.type_name == "FP32-F"
    assert wide.type_name == "FP32-B"
    # the fp16-based types were excluded by the range check, not tried
    statuses = {t.type_name: t.status for t in wide.trials}
    assert statuses["FP32-F"] == statuses["FP16"] == "out of range"
    assert "FP32-B" in wide.explain() and "out of range" in wide.explain()


@pytest.mark.parametrize("name", sorted(APPS))
def test_chosen_type_meets_the_requirement_when_rerun(name):
    app = get_app(name, "tiny")
    inputs = app.make_inputs(np.random.default_rng(0))
    choice = select_type(app, inputs)
    assert choice.type_name is not None and choice.metric <= app.requirement
    # an independent rerun with the chosen type meets it too
    etype = get_type(choice.type_name)
    metric = app.metric(inputs, app.run(inputs, type_matmul(etype, DSA("a100"))))
    assert metric <= app.requirement
    # everything tried before it missed or was excluded
    assert all(t.status != "chosen" for t in choice.trials[:-1])


def test_precision_is_not_always_needed_and_fp64_work_escalates():
    mlp = get_type(select_type(get_app("mlp", "tiny")).type_name)
    assert mlp.family == "narrow" and mlp.native_gemms == 1
    cg = select_type(get_app("cg", "tiny"))
    assert get_type(cg.type_name).family == "fp64"
    assert any(t.status == "missed" for t in cg.trials)


def test_impossible_requirement_raises_with_every_trial():
    app = get_app("gemm-narrow", "tiny")
    with pytest.raises(NoTypeMeetsRequirement, match="no emulated type") as info:
        select_type(app, requirement=1e-30)
    assert info.value.choice.type_name is None
    assert all(t.status != "chosen" for t in info.value.choice.trials)
    with pytest.raises(ValueError, match="positive"):
        select_type(app, requirement=0.0)


def test_profile_without_bf16_excludes_bf16_types():
    choice = select_type(get_app("gemm-narrow", "tiny"), profile="ascend910")
    statuses = {t.type_name: t.status for t in choice.trials}
    assert statuses["FP32-B"] == statuses["BF16"] == "not native"
    assert choice.type_name == "FP32-F"


def test_per_tile_choice_mixes_types_and_stays_accurate():
    rng = np.random.default_rng(0)
    A = rng.uniform(-1, 1, (256, 256)).astype(np.float32)
    B = rng.uniform(-1, 1, (256, 256)).astype(np.float32)
    # rows are scaled by powers of two, so what takes a tile out of FP32-F's range is the
    # spread within a row: 1e9 next to entries of about 1e-2 is beyond fp16's 2^28
    A[200, 10] = 1e9
    tiled = PerTileType(["FP32-F", "FP32-B"], tile=128)
    assert not get_type("FP32-F").fits_range(A[128:, :128], B[:128, :128])
    assert tiled.fits_range(A, B)
    C = tiled.gemm(A, B, DSA("a100"))
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert naive.normwise_error(C, ref, scale=naive.gemm_floor(A, B)) < 1e-6
    # 2 x 2 output tiles x 2 k-tiles = 8 tile products; the row block with 1e9 at k-tile 0
    # meets both column blocks of B
    assert tiled.tile_counts == {"FP32-F": 6, "FP32-B": 2}
    with pytest.raises(ValueError, match="family"):
        PerTileType(["FP32-F", "OZ2-N12"])


def test_small_data_is_scaled_not_excluded_and_the_bound_holds():
    """Ape's range rule only looked at the upper end; FP32-F on 1e-8 data missed its bound
    by 16x. Rows and columns are now scaled by powers of two, so FP32-F takes such data and
    meets fp32 accuracy."""
    app = get_app("gemm-narrow", "tiny")
    inputs = app.make_inputs(np.random.default_rng(0))
    a = (inputs["a"] * np.float32(1e-8)).astype(np.float32)
    b = inputs["b"]
    inputs = {"a": a, "b": b, "reference": a.astype(np.float64) @ b.astype(np.float64)}
    choice = select_type(app, inputs)
    assert choice.type_name == "FP32-F" and choice.metric <= 1e-6
    etype = get_type("FP32-F")
    C = etype.gemm(a, b, DSA("a100"))
    assert naive.componentwise_error(C, inputs["reference"], a, b) <= etype.error_bound(a.shape[1])


class _DriftingApp:
    """Traced once on benign data; every later run feeds a row whose magnitudes spread
    beyond fp16's reach, as an iterate that drifts away from the trace would."""

    name, metric_name, requirement = "drifting", "normwise error", 1e-5

    def __init__(self):
        self.runs = 0

    def make_inputs(self, rng):
        return {"a": rng.uniform(-1, 1, (16, 16)).astype(np.float32),
                "b": rng.uniform(-1, 1, (16, 16)).astype(np.float32)}

    def run(self, inputs, matmul):
        a = inputs["a"].copy()
        if self.runs:
            a[0, 0] = 1e12
        self.runs += 1
        return np.asarray(matmul(a, inputs["b"]), dtype=np.float64), a

    def metric(self, inputs, result):
        C, a = result
        ref = a.astype(np.float64) @ inputs["b"].astype(np.float64)
        return naive.normwise_error(C, ref, scale=naive.gemm_floor(a, inputs["b"]))


def test_a_type_refusing_its_own_run_fails_and_is_never_chosen():
    choice = select_type(_DriftingApp(), candidates=["FP32-F", "FP32-B"])
    statuses = {t.type_name: t.status for t in choice.trials}
    assert statuses == {"FP32-F": "failed", "FP32-B": "chosen"}
    assert "spread" in next(t.detail for t in choice.trials if t.type_name == "FP32-F")
