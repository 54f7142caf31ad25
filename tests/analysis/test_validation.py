"""The model against public measurements: the corpus's shape and provenance, the
cross-validation that keeps each source out of its own fit, bands set by the other
sources' errors, and (slow) `characterize validate` reproducing the committed figure."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from characterize.analysis import validation as V
from characterize.analysis.model.constants import ModelConstants
from characterize.analysis.model.validation_error import ERROR_PATH, model_error
from characterize.cli import main
from characterize.hardware.specs import GPUS, gpu_spec


def test_the_corpus_has_what_a_validation_needs():
    df = V.load_measurements(here=None)
    assert len(df) >= 30 and df["source"].nunique() >= 3
    assert set(df["expressible"]) <= {"yes", "no", "proxy"}
    generations = {gpu_spec(k).arch[:4] for k in df["gpu_key"] if k in GPUS}
    assert len(generations) >= 2                      # Volta, Ampere, Hopper, Blackwell rows
    for col in ("citation", "url", "gpu", "kernel", "measured_us", "timing_method"):
        assert (df[col].str.len() > 0).all(), col
    assert (df["measured_us"].astype(float) > 0).all()
    assert (df.loc[df["expressible"] == "no", "why_not"].str.len() > 0).all()   # left out, with why
    rows = V.expressible(df)
    assert len(rows) == int(df["expressible"].isin(["yes", "proxy"]).sum())
    assert {m.source for m in rows if not m.proxy} >= {"pytorch-pr-167834", "flaggems-pr-5610"}
    assert all(m.workload.batches == 2 and m.measured_us > 0 for m in rows)


def test_a_band_is_the_symmetric_quantile_of_the_log_errors():
    lo, hi = V.band_from_residuals(np.array([1.1, 1 / 1.2, 1.05, 1.3, 0.9]), share=0.8)
    assert lo == pytest.approx(1 / hi) and 1.2 < hi < 1.3
    assert V.band_from_residuals(np.array([])) == (1.0, 1.0)


def test_a_rows_band_is_set_by_the_other_sources_never_its_own():
    sources = ["a", "a", "b", "b", "c"]
    predicted = np.ones(5)
    measured = np.array([1.05, 0.95, 1.1, 0.9, 3.0])     # c is far off
    lo, hi = V.honest_bands(sources, predicted, measured, predicted, predicted)
    assert hi[4] < 1.2                                  # c's own error does not widen c's band
    assert hi[0] > 2.0                                  # but it widens the others'
    assert ((lo <= predicted) & (predicted <= hi)).all()


def test_cross_validation_predicts_each_source_with_constants_fitted_on_the_others():
    """A toy model whose time is the DRAM latency: sources a and b measure 20% above the
    published value, c 20% below. Held out, c gets a and b's fit (too slow for c), and
    a gets b and c's compromise: no source is scored on its own fit."""
    gpu = gpu_spec("h100-sxm")
    base = {gpu.key: ModelConstants.defaults(gpu)}
    d0 = base[gpu.key].dram_latency_ns
    sources = ["a", "a", "b", "b", "c", "c"]
    measured = np.array([1.2, 1.2, 1.2, 1.2, 0.8, 0.8])

    def predict_rows(c, idx=None):
        idx = range(len(sources)) if idx is None else idx
        return np.array([c[gpu.key].dram_latency_ns / d0 for _ in idx])

    held, folds = V.cross_validate(sources, predict_rows, measured, base)
    assert set(folds) == {"a", "b", "c"}
    assert held[4] > 1.05 and held[0] < held[4]        # c predicted from a and b: slow; a from b and c: between
    fitted = V.fit_scale(lambda c: predict_rows(c), measured, base)
    assert all(lo <= x <= hi for x, (lo, hi) in zip(fitted, [V.BAND.get(n, (0.8, 1.25)) for n in V.CV_CONSTANTS]))


def test_the_committed_figure_is_what_predictions_carry():
    err = model_error()
    stored = json.loads(ERROR_PATH.read_text())
    assert err is not None and err.n == stored["n"] >= 10 and err.sources == stored["sources"] >= 3
    assert stored["cv"] == "leave-one-source-out" and stored["coverage"] >= 0.8
    assert stored["low"] < 1 < stored["high"] and math.isclose(stored["low"] * stored["high"], 1, rel_tol=1e-9)
    assert "GMAE" in err.sentence() and str(err.n) in err.sentence()


@pytest.mark.slow
def test_validate_reproduces_the_committed_figure_and_meets_the_targets():
    res = CliRunner().invoke(main, ["validate", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    stored = json.loads(ERROR_PATH.read_text())
    assert out["error"]["n"] == stored["n"] and out["error"]["gmae"] == pytest.approx(stored["gmae"], rel=1e-6)
    summary = pd.DataFrame(out["summary"]).set_index("source")
    assert summary.loc["all", "gmae"] <= 0.15 and summary.loc["all", "inside_band"] >= 0.8
    rows = pd.DataFrame(out["rows"])
    assert (rows["band_low_us"] <= rows["cv_predicted_us"]).all() and not rows["proxy"].all()
    assert len(out["left_out"]) >= 30 and all(r["why_not"] for r in out["left_out"])
    # the fastest-variant check says by how much: a right group's runner-up is slower on both
    # sides; a miss's predicted winner measured slower, and its measured winner predicted slower
    best = pd.DataFrame(out["here"]["best"])
    assert len(best) >= 30 and best["right"].sum() >= 30
    assert (best["measured_margin_pct"] >= 0).all() and (best["predicted_margin_pct"] >= 0).all()
    rows = pd.DataFrame(out["here"]["rows"]).assign(t=lambda r: r["measured_us"] / r["tables_per_launch"])
    for miss in best[~best["right"]].to_dict("records"):
        group = rows[(rows["source"] == miss["source"]) & (rows["dataset"] == miss["dataset"]) &
                     (rows["mode"] == miss["mode"])].drop_duplicates("variant").set_index("variant")["t"]
        assert miss["measured_margin_pct"] == pytest.approx(
            100 * (group[miss["predicted_best"]] / group[miss["measured_best"]] - 1))


def test_our_own_runs_join_the_corpus_with_their_provenance_per_launch(tmp_path):
    """A measured run's bench points become corpus rows: one per point and mode, the time of one
    launch (tbe's covers every table: 12 x its per-table time), tbe's work order as it ran (every
    table at once before phases existed), the run's workload and GPU; add_run replaces a source's
    rows. The committed H200 run (profiles/h200/paper-gpu) and our corpus agree."""
    from pathlib import Path

    from characterize.store import load_run

    run = load_run(Path(__file__).resolve().parents[2] / "profiles" / "h200" / "paper-gpu")
    rows = V.run_corpus_rows(run, "test-h200", "profiles/h200")
    assert len(rows) == 90 and {r["gpu_key"] for r in rows} == {"h200"}
    tbe = next(r for r in rows if r["id"] == "test-h200:tbe:medium:steady")
    per_table = next(s["per_table_us"] for s in run.points("bench") if s["variant"] == "tbe" and s["dataset"] == "medium"
                     for s in s["summary"] if s["mode"] == "steady")
    assert tbe["tables_per_launch"] == "12" and float(tbe["measured_us"]) == pytest.approx(12 * per_table, rel=1e-4)
    assert "tables_in_flight=12" in tbe["params"] and tbe["citation"] == "profiles/h200"
    path = tmp_path / "here.csv"
    assert V.add_run(run, "x", path=path) == ("x", 90) and V.add_run(run, "x", path=path) == ("x", 90)
    assert len(V.load_measurements(here=path).query("origin == 'here'")) == 90   # replaced, not appended
    ours = V.load_measurements().query("origin == 'here'")
    assert {"h200-paper", "h200-shape-a", "h200-shape-c", "h200-shape-d", "h200-tbe-order"} <= set(ours["source"])
    assert (ours["measured_us"].astype(float) > 0).all() and (ours["citation"].str.len() > 0).all()


def test_regimes_and_their_bands():
    from characterize.analysis.model.validation_error import ModelError, regime_of

    assert regime_of("uvm", 150, "dram") == "host tables" and regime_of("none", 1, "dram") == "short bags"
    assert regime_of("none", 150, "dram") == "DRAM-bound" and regime_of("none", 150, "latency") == "latency-bound"
    assert regime_of("none", 150, "issue") == regime_of("none", 150, "l2") == "L1/L2-resident"
    lo, hi = V.regime_band(np.log(np.array([0.9, 1.0, 1.05, 1.1, 1.2] * 4)))
    assert 0.9 <= lo < 1.0 < hi <= 1.2
    err = ModelError(15, 4, 0.07, 0.1, 0.9, 0.86, 1.16, "x", "y", regimes={"short bags": [0.55, 1.5, 32],
                                                                          "host tables": [0.7, 1.0, 4]})
    assert err.band("short bags") == (0.55, 1.5) and err.band("host tables") == (0.86, 1.16)   # too few: public


def test_a_datasets_band_comes_from_fits_that_never_saw_it():
    """The toy DRAM-latency model again: datasets a and b measure 20% above the published
    value, c 20% below. The residuals a band for a is drawn from are b's and c's, each
    predicted with constants refitted on the third dataset alone: a's own measurements change
    none of them."""
    gpu = gpu_spec("h100-sxm")
    base = {gpu.key: ModelConstants.defaults(gpu)}
    d0 = base[gpu.key].dram_latency_ns
    keys = ["a", "a", "b", "b", "c", "c"]

    def predict_rows(c, idx):
        return np.array([c[gpu.key].dram_latency_ns / d0 for _ in idx])

    measured = np.array([1.2, 1.2, 1.2, 1.2, 0.8, 0.8])
    nested = V.nested_residuals(keys, predict_rows, measured, base, ["dram_latency_ns"])
    assert set(nested) == {"a", "b", "c"}
    assert np.isnan(nested["a"][:2]).all() and np.isfinite(nested["a"][2:]).all()
    assert nested["a"][2] > 0.2 > -0.2 > nested["a"][4]   # b from c's fit (fast), c from b's (slow)
    moved = V.nested_residuals(keys, predict_rows, np.array([3.0, 0.5, 1.2, 1.2, 0.8, 0.8]), base,
                               ["dram_latency_ns"])
    assert np.allclose(moved["a"][2:], nested["a"][2:])


def test_a_bands_tail_is_the_narrowest_that_held_the_other_datasets():
    """Datasets whose errors look alike: the 5th-95th percentile of the others' holds 90% of each,
    so the narrowest tail is kept. One dataset whose errors run past everyone else's: no tail
    holds 90% of it and the others, so the band spans the whole range of the errors seen."""
    alike = np.tile(np.linspace(-0.1, 0.1, 20), 4)
    ds = np.repeat(["a", "b", "c", "d"], 20)
    reg = np.array(["DRAM-bound"] * 80)
    assert V.choose_tail(alike, reg, ds) == V.BAND_TAILS[0]
    apart = alike + np.where(ds == "d", 0.15, 0.0)
    assert V.choose_tail(apart, reg, ds) == V.BAND_TAILS[-1]
    assert V.choose_tail(alike[:20], reg[:20], ds[:20]) == V.BAND_TAILS[-1]   # one dataset: nothing to hold out
    lo, hi = V.regime_band(alike, 0.0)
    assert (lo, hi) == pytest.approx((np.exp(-0.1), np.exp(0.1)))
