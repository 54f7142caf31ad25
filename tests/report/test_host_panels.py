"""Report panels of precision and host-resident tables, drawn from a run's model
predictions: the precision x variant grid, the cache hit rate against the cache size, the
time split per batch and the host bytes against the link; each says it is a prediction,
and a run without such rows says why the panel is empty."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from characterize.analysis.model import predict as MP
from characterize.pipeline import load_experiment, run_meta
from characterize.report.render import render_report
from characterize.store import RunDir
from tests.analysis.test_host_model import WL
from tests.analysis.test_model import sass, static
from tests.conftest import write_experiment
from tests.report.test_report import images, is_missing, panel_html, reason

HOST_PANELS = ("s1-precision", "s1-cache-ratio", "s1-host-time", "s1-host-bytes")


def run_with(tmp: Path, predictions: pd.DataFrame) -> Path:
    exp = load_experiment(str(write_experiment(tmp, datasets=("medium", "low"), variants=("base",))))
    path = tmp / "run"
    run = RunDir.create(path, run_meta(exp, path, None))
    run.write("predictions", predictions)
    return path


def predictions(dtypes=("fp32", "fp16", "int8"), ratios=(0.002, 0.015, 0.2)) -> pd.DataFrame:
    """Real model rows (fixed static and SASS tables): each dtype, and cache + uvm at several sizes."""
    frames = [MP.predict(WL.replace(dtype=dt), ["medium", "low"], ["base", "rpf", "cache", "uvm"], ["sm_80"],
                         static=static(), sass=sass(), cache_ratios=list(ratios))
              for dt in dtypes]
    return pd.concat(frames, ignore_index=True)


def test_host_and_precision_panels_draw_the_predictions(tmp_path):
    out = render_report([run_with(tmp_path, predictions())], tmp_path / "r.html")
    html = out.read_text()
    for panel in HOST_PANELS:
        assert not is_missing(html, panel), reason(html, panel)
        part = panel_html(html, panel)
        assert "not measurements" in part and "PREDICT" in part, panel
        assert len(images(part)) >= 1, panel
    grid = panel_html(html, "s1-precision")
    assert "int8" in grid and "fp16" in grid and "rpf" in grid
    assert set(MP.precision_grid(predictions())["variant"]) == {"base", "rpf"}   # host rows have their own panels
    ratios = panel_html(html, "s1-cache-ratio")
    assert "0.2%" in ratios and "1.5%" in ratios and "20.0%" in ratios
    assert "PCIe 4.0 x16" in panel_html(html, "s1-host-bytes")


def run_asking(tmp: Path, predictions: pd.DataFrame, variants=("base",), dtypes=()) -> Path:
    """A run whose experiment names `variants` and `dtypes`, holding `predictions`."""
    exp = load_experiment(str(write_experiment(tmp, datasets=("medium", "low"), variants=variants)))
    exp = dataclasses.replace(exp, dtypes=tuple(dtypes))
    path = tmp / "asking"
    run = RunDir.create(path, run_meta(exp, path, None))
    run.write("predictions", predictions)
    return path


def test_panels_the_experiment_did_not_ask_for_are_left_out(tmp_path):
    """Host-resident panels only when the experiment names cache or uvm (or the predictions
    hold their rows), the precision grid only when it lists precisions."""
    only = predictions(dtypes=("fp32",))
    out = render_report([run_with(tmp_path, only[~only["variant"].isin(["cache", "uvm"])])], tmp_path / "r.html")
    html = out.read_text()
    for panel in HOST_PANELS:
        assert f'id="{panel}"' not in html, panel
    assert not is_missing(html, "s1-predictions")


def test_a_run_without_host_rows_or_precisions_says_why(tmp_path):
    only = predictions(dtypes=("fp32",))
    path = run_asking(tmp_path, only[~only["variant"].isin(["cache", "uvm"])], variants=("base", "cache"),
                      dtypes=("fp16",))
    html = render_report([path], tmp_path / "r.html").read_text()
    assert is_missing(html, "s1-precision") and "one precision" in reason(html, "s1-precision")
    assert is_missing(html, "s1-cache-ratio") and "no cache rows" in reason(html, "s1-cache-ratio")
    assert is_missing(html, "s1-host-time") and "cache or uvm" in reason(html, "s1-host-time")
