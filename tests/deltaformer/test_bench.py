"""Tests for the DeltaFormer kernel benchmark (Xu et al., NeurIPS 2025, Sec. 3.2 vs Sec. 3.4 vs
causal softmax attention): row keys, positive times, non-negative peak memory, and that the
three implementations compute what they should. No timing assertions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from furnace.deltaformer import bench
from furnace.deltaformer.bench import bench_kernels, format_rows, make_inputs, peak_worker

TIME_KEYS = [f"{kind}_ms_{impl}" for kind in ("fwd", "fwdbwd") for impl in bench.IMPLS]
PEAK_KEYS = [f"peak_mib_{impl}" for impl in bench.IMPLS]
RATIO_KEYS = ["naive_over_chunk", "chunk_over_sdpa", "fwd_naive_over_chunk", "fwd_chunk_over_sdpa"]


def test_rows_have_positive_times_and_expected_keys():
    rows = bench_kernels((16, 32), heads=2, dim=8, chunk_size=8, repeats=1, measure_memory=False)
    assert [row["T"] for row in rows] == [16, 32]
    for row in rows:
        assert set(TIME_KEYS + PEAK_KEYS + RATIO_KEYS) <= set(row)
        for key in TIME_KEYS + RATIO_KEYS:
            assert row[key] > 0 and math.isfinite(row[key]), key
        assert all(row[key] is None for key in PEAK_KEYS)
        assert 0 <= row["max_rel_err_chunk_vs_naive"] <= bench.AGREEMENT_TOLERANCE
    assert all(len(cells) == len(bench.COLUMNS) for cells in format_rows(rows))


def test_naive_is_skipped_above_the_limit():
    (row,) = bench_kernels(
        (32,), heads=1, dim=8, chunk_size=8, repeats=1, include_naive_up_to=16,
        measure_memory=False,
    )
    assert row["fwdbwd_ms_naive"] is None and row["naive_over_chunk"] is None
    assert row["fwdbwd_ms_chunk"] > 0 and row["chunk_over_sdpa"] > 0


def test_peak_memory_is_a_non_negative_number():
    (row,) = bench_kernels((16,), heads=1, dim=8, chunk_size=8, repeats=1, measure_memory=True)
    for key in PEAK_KEYS:
        assert isinstance(row[key], float) and row[key] >= 0, key


def test_implementations_agree():
    # float32, O(1) inputs: the three paths sum in other orders (and BLAS splits sums by
    # thread count), ~1e-7 here; atol 1e-5 is ~100 ulps of the outputs' O(1) magnitude
    x = make_inputs(1, 24, 2, 8)
    with torch.no_grad():
        naive = bench._forward("naive", x, "softmax", 8)
        chunk = bench._forward("chunk", x, "softmax", 8)
        assert torch.allclose(chunk, naive, atol=1e-5, rtol=1e-4)
        # beta = 0 leaves u = v, so DeltaFormer is the causal softmax attention SDPA computes.
        x["beta"] = torch.zeros_like(x["beta"])
        sdpa = bench._forward("sdpa", x, "softmax", 8)
        assert torch.allclose(bench._forward("chunk", x, "softmax", 8), sdpa, atol=1e-5)
        assert torch.allclose(bench._forward("naive", x, "softmax", 8), sdpa, atol=1e-5)


def test_disagreement_raises(monkeypatch):
    def broken(q, k, v, w, beta, **kwargs):
        return F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2)

    monkeypatch.setattr(bench, "deltaformer_chunk", broken)
    with pytest.raises(RuntimeError, match="disagree"):
        bench_kernels((16,), heads=1, dim=8, repeats=1, measure_memory=False)


def test_worker_and_main_run(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # rich would otherwise squeeze the headers
    # peak_worker runs with the thread count it is given and restores the caller's after
    before = torch.get_num_threads()
    peak_worker("chunk", 1, 16, 1, 8, "softmax", 8, 2 if before == 1 else 1)
    assert torch.get_num_threads() == before
    assert bench.main(["--lengths", "16", "--heads", "1", "--dim", "8", "--chunk-size", "8",
                       "--repeats", "1", "--no-memory", "--threads", "0"]) == 0
    assert "chunk" in capsys.readouterr().out


def test_agreement_error_is_floored_by_the_values_scale():
    # a zero reference (zero values give a zero output) must not turn rounding into 1e22
    v = torch.randn(1, 4, 1, 8)
    zero = torch.zeros(1, 4, 1, 8)
    assert bench.agreement_error(zero, zero + 1e-9, v) == pytest.approx(
        1e-9 / v.abs().max().item(), rel=1e-6)
    assert bench.agreement_error(zero, zero, torch.zeros_like(v)) == 0.0
    assert bench.agreement_error(zero, zero + 1e-9, torch.zeros_like(v)) == math.inf
    ref = torch.full((2, 3), 4.0)
    assert bench.agreement_error(ref, ref + 0.5, torch.ones(2, 3)) == pytest.approx(0.125)


def test_one_token_rows_report_a_finite_agreement():
    (row,) = bench_kernels((1,), heads=1, dim=8, chunk_size=8, repeats=1, measure_memory=False)
    assert 0 <= row["max_rel_err_chunk_vs_naive"] <= bench.AGREEMENT_TOLERANCE


@pytest.mark.parametrize("argv", [["--lengths", "0"], ["--repeats", "0"], ["--kappa1", "exp"],
                                  ["--json", "/no/such/folder/out.json"]])
def test_module_main_rejects_bad_inputs_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and argv[0] in err
