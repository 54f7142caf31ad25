"""The answer: per dataset and GPU the best variant, its speedups over the references that
have rows (never assumed), the band, the bound, the end-to-end effect and how the number
was obtained; measured timings answer for their GPU, predictions for the others."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import characterize as chz
from characterize.analysis.answer import COLUMNS, NOT_VALIDATED, ModelValidation, answer, answer_run, band_text

PAPER_RUN = Path(__file__).parents[2] / "profiles" / "static-paper"


def pred_rows(times: dict[str, float], gpu: str = "a100-80gb", dataset: str = "medium", band: float = 0.1,
              bound: str = "latency", dtype: str = "fp32") -> list[dict]:
    """Prediction rows with predictions.csv's columns: each variant's time and a band of +-band."""
    return [{"variant": v, "dtype": dtype, "dataset": dataset, "arch": "sm_80", "gpu": gpu, "mode": "steady",
             "time_us": t, "time_us_low": t * (1 - band), "time_us_high": t * (1 + band),
             "speedup_vs_base": times["base"] / t if "base" in times else np.nan, "bound": bound, "note": ""}
            for v, t in times.items()]


def test_speedups_come_from_each_reference_s_own_row():
    p = pd.DataFrame(pred_rows({"torch": 150.0, "base": 200.0, "rpf": 80.0, "warp": 50.0, "fbgemm": 60.0}))
    a = answer(p)
    r = a.rows.iloc[0]
    assert r["best"] == "warp" and r["source"] == "predicted" and r["bound"] == "latency"
    assert r["speedup_vs_base"] == pytest.approx(4.0) and r["speedup_vs_torch"] == pytest.approx(3.0)
    assert r["speedup_vs_fbgemm"] == pytest.approx(1.2)
    # both ends of the band taken at the same end of the constants' ranges
    assert r["speedup_vs_torch_low"] == pytest.approx(3.0) == r["speedup_vs_torch_high"]
    assert set(COLUMNS) <= set(a.rows.columns)
    row = a.display_rows()[0]
    assert row["vs torch"] == "3.00x" and row["vs base"] == "4.00x" and row["vs fbgemm"] == "1.20x"


def test_without_an_fbgemm_row_no_fbgemm_column_and_no_nan():
    p = pd.DataFrame(pred_rows({"torch": 150.0, "base": 200.0, "warp": 50.0}) +
                     pred_rows({"torch": 90.0, "base": 100.0, "warp": 60.0}, dataset="high"))
    a = answer(p)
    assert a.rows["speedup_vs_fbgemm"].isna().all()
    text = "\n".join(a.lines()) + str(a.display_rows())
    assert "fbgemm" not in text and "nan" not in text.lower()
    assert list(a.rows["dataset"]) == ["high", "medium"]   # hottest first


def test_the_band_and_the_variants_inside_it():
    times = {"base": 200.0, "rpf": 81.0, "combined": 78.0, "warp": 120.0}
    rows = pred_rows(times)
    for r in rows:   # combined: a wide band that holds rpf
        if r["variant"] == "combined":
            r["time_us_low"], r["time_us_high"] = 70.0, 90.0
        if r["variant"] == "base":
            r["time_us_low"], r["time_us_high"] = 150.0, 260.0
    a = answer(pd.DataFrame(rows))
    r = a.rows.iloc[0]
    assert r["best"] == "combined" and r["close"] == "rpf"
    assert r["speedup_vs_base_low"] == pytest.approx(150 / 70) and r["speedup_vs_base_high"] == pytest.approx(260 / 90)
    assert a.display_rows()[0]["vs base"] == f"{200 / 78:.2f}x [{150 / 70:.2f}-{260 / 90:.2f}]"


def test_test_only_and_host_resident_variants_are_not_the_answer():
    p = pd.DataFrame(pred_rows({"base": 200.0, "wrong": 1.0, "cache": 10.0, "rpf": 100.0}))
    assert answer(p).rows.iloc[0]["best"] == "rpf"
    host_only = pd.DataFrame(pred_rows({"cache": 900.0, "uvm": 3000.0}))
    r = answer(host_only).rows.iloc[0]
    assert r["best"] == "cache" and math.isnan(r["speedup_vs_base"])


def test_how_sure_says_not_validated_until_a_validation_is_given(monkeypatch):
    from characterize.analysis import answer as A

    p = pd.DataFrame(pred_rows({"base": 200.0, "warp": 50.0}))
    stored = answer(p).how()   # by default, the figure `characterize validate --write` stored
    assert "PREDICTED" in stored and "GMAE" in stored and "held out source by source" in stored
    monkeypatch.setattr(A, "stored_validation", lambda: None)
    assert NOT_VALIDATED in answer(p).how() and "PREDICTED" in answer(p).how()
    v = ModelValidation(n=37, gmae=0.184, mape=0.22, coverage=0.62, source="public measurements (3 sources)")
    how = answer(p, validation=v).how()
    assert NOT_VALIDATED not in how
    assert "GMAE is 18% on 37 public measurements (3 sources), 62% of them inside its band" in how
    claims = pd.DataFrame({"claim": ["a", "b", "c"], "agrees": [True, False, True]})
    assert "reproduces 2 of the paper's 3 published claims" in answer(p, model_validation=claims).how()


def test_measured_timings_answer_for_their_gpu_with_their_ci():
    p = pd.DataFrame(pred_rows({"torch": 150.0, "base": 200.0, "warp": 50.0}) +
                     pred_rows({"torch": 150.0, "base": 200.0, "warp": 40.0}, gpu="h100-sxm"))
    bench = pd.DataFrame([{"variant": v, "dataset": "medium", "status": "ok", "mode": "steady", "per_table_us": t,
                           "ci95_us": 0.02 * t} for v, t in (("torch", 120.0), ("base", 180.0), ("warp", 90.0),
                                                            ("rpf", 85.0))])
    a = answer(p, bench, gpu="a100-80gb")
    m = a.rows.set_index("gpu")
    assert list(a.rows["gpu"]) == ["a100-80gb", "h100-sxm"]   # the measured GPU first
    assert m.loc["a100-80gb", "source"] == "measured" and m.loc["a100-80gb", "best"] == "rpf"
    assert m.loc["a100-80gb", "speedup_vs_torch"] == pytest.approx(120 / 85)
    assert m.loc["a100-80gb", "speedup_vs_torch_low"] < 120 / 85 < m.loc["a100-80gb", "speedup_vs_torch_high"]
    assert m.loc["a100-80gb", "close"] == ""   # warp's 90 us lies outside rpf's 85 +- 1.7 us
    assert m.loc["h100-sxm", "source"] == "predicted"
    assert "MEASURED with CUDA events" in a.how() and "PREDICTED" in a.how()
    assert "source" in a.display_rows()[0]
    no_bound = answer(p.assign(bound=np.nan), bench, gpu="a100-80gb")
    assert [r["bound"] for r in no_bound.display_rows()] == ["–", "–"]


def test_the_end_to_end_effect_comes_from_e2e_rows():
    p = pd.DataFrame(pred_rows({"base": 200.0, "warp": 50.0}))
    e2e = pd.DataFrame([{"variant": v, "dataset": "medium", "gpu": "a100-80gb", "phase": ph, "source": "predicted",
                         "stage": "total", "speedup_e2e": s, "embedding_share": sh}
                        for v, ph, s, sh in (("warp", "inference", 1.8, 0.25), ("warp", "training", 1.2, 0.1),
                                             ("base", "inference", 1.0, 0.5))])
    r = answer(p, e2e=e2e).rows.iloc[0]
    assert r["e2e_speedup"] == pytest.approx(1.8) and r["embedding_share"] == pytest.approx(0.25)
    assert answer(p, e2e=e2e).display_rows()[0]["end to end"] == "1.80x"


def test_band_text_never_prints_nan():
    assert band_text(np.nan) == "–" and band_text(None) == "–" and band_text("x") == "–"
    assert band_text(2.0, np.nan, 3.0) == "2.00x" and band_text(2.0, 2.0, 2.0) == "2.00x"
    assert band_text(2.0, 1.5, 2.5) == "2.00x [1.50-2.50]"


def test_the_committed_run_s_answer_matches_its_predictions():
    run = chz.load_run(PAPER_RUN)
    a = answer_run(run)
    assert len(a.rows) == 10 and set(a.rows["source"]) == {"predicted"}
    p = run.predictions
    p = p[(p["dtype"] == "fp32") & (p["mode"] == "steady")]
    for r in a.rows.to_dict("records"):
        d = p[(p["gpu"] == r["gpu"]) & (p["dataset"] == r["dataset"]) & (p["variant"] != "wrong")]
        per_table = d["time_us"] / d["tables_per_launch"]   # a launch covering every table, per table
        assert r["time_us"] == pytest.approx(per_table.min())
        torch = d[d["variant"] == "torch"]["time_us"].iloc[0]
        assert r["speedup_vs_torch"] == pytest.approx(torch / r["time_us"])
    agree = int(run.model_validation["agrees"].astype(str).str.lower().eq("true").sum())
    assert a.claims == (agree, 4) and "torch: torch 2.13.0's own SASS" in "\n".join(a.lines())
    # a predicted answer says how the model did on public measurements it was not fitted to
    assert a.validation is not None and a.validation.n >= 10 and "GMAE" in a.how()
    assert "nan" not in "\n".join(a.lines()).lower()


# ------------------------------------------------ measured on our H200 (profiles/h200)
H200 = Path(__file__).resolve().parents[2] / "profiles" / "h200"


def test_a_bench_and_a_profile_of_one_experiment_read_as_one_run_and_one_answer():
    """The first H200 run's bench (paper-gpu) and the profile made apart (paper-gpu-profile)
    merge into one run: every bench point, the profile points of both, the answer measured,
    its time per table and per batch, and where the best point was profiled, its bound from
    ncu in numbers (share of peak, and of the device's copy bandwidth for DRAM)."""
    from characterize.analysis.answer import answer_run
    from characterize.store import MergedRun, load_runs

    (run,) = load_runs([H200 / "paper-gpu", H200 / "paper-gpu-profile"])
    assert isinstance(run, MergedRun) and len(run.points("bench")) == 45
    assert {(p["variant"], p["dataset"]) for p in run.points("profile")} >= {("tbe", "random"), ("warp", "random"),
                                                                              ("base", "medium")}
    a = answer_run(run)
    random = a.rows[a.rows["gpu"] == "h200"].set_index("dataset").loc["random"]   # the others: predicted
    assert random["source"] == "measured" and random["best"] == "tbe" and random["bound_source"] == "ncu"
    assert random["batch_us"] == pytest.approx(12 * random["time_us"])
    assert "DRAM 83% of peak (95% of the copy bandwidth)" in random["bound_why"] and "L2 91%" in random["bound_why"]
    shown = next(r for r in a.display_rows() if r["GPU"] == "h200" and r["dataset"] == "random")
    assert shown["us/table"] == "40.1" and shown["us/batch"] == "480.9"


def test_the_papers_claims_are_checked_on_the_measured_gpu():
    """OptMT bought 2% on the H200 (against "up to +53%" on the paper's A100): said, not hidden."""
    from characterize.analysis.answer import answer_run
    from characterize.store import load_run

    a = answer_run(load_run(H200 / "paper-gpu"))
    claims = a.measured_claims.set_index("claim")
    optmt = claims.loc["OptMT (register cap) speedup over base"]
    assert optmt["measured"].startswith("+2%") and not optmt["reproduced"] and optmt["gpu"] == "h200"
    assert claims.loc["combined (rpf + l2p, capped) speedup over base", "measured"].startswith("+65%")
    assert any("not reproduced" in line and "OptMT" in line for line in a.lines())


def test_a_run_profiled_but_not_benched_answers_from_ncus_durations():
    """paper-gpu-profile holds ncu reports of torch, warp, combined, rpf and l2p on random and no
    timings: the answer comes from the kernels' durations per table, said to be ncu's."""
    from characterize.analysis.answer import answer_run
    from characterize.store import load_run

    a = answer_run(load_run(H200 / "paper-gpu-profile"))
    row = a.rows.set_index("dataset").loc["random"]
    assert row["source"] == "ncu" and row["best"] == "warp" and 40 < row["time_us"] < 43
    assert row["speedup_vs_torch"] == pytest.approx(2.28, abs=0.02) and "L2 81% of peak" in row["bound_why"]
    assert "Nsight Compute's kernel durations" in a.how()


def test_a_variant_is_tied_only_when_the_speedups_band_reaches_one():
    # predicted times move with the model's constants: a wide band on the best does not
    # make a variant that is slower at both ends of the constants a tie
    times = {"base": 200.0, "warp": 50.0, "rpf": 60.0, "l2p": 52.0}
    rows = pred_rows(times)
    ends = {"warp": (30.0, 100.0), "rpf": (55.0, 120.0), "l2p": (29.0, 104.0)}
    for r in rows:
        r["time_us_low"], r["time_us_high"] = ends.get(r["variant"], (r["time_us"], r["time_us"]))
    r = answer(pd.DataFrame(rows)).rows.iloc[0]
    assert r["best"] == "warp" and r["close"] == "l2p"   # rpf: 1.2x at the middle, 1.83x and 1.2x at the ends
