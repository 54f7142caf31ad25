"""Figures: every builder draws something for small odd inputs, in registry order."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from characterize.analysis.ncu import kernel_labels
from characterize.kernels.registry import VARIANT_ORDER
from characterize.report import plots
from characterize.workloads.presets import HOTNESS_ORDER


def _pixels(fig) -> np.ndarray:
    return imread(io.BytesIO(plots.png(fig)))


def _not_blank(fig) -> bool:
    img = _pixels(fig)
    return img.shape[0] > 50 and float(img[..., :3].std()) > 0.01


def test_orders_come_from_the_registries():
    assert plots.order_variants(["warp", "zz", "base", "torch"]) == ["torch", "base", "warp", "zz"]
    assert plots.order_datasets(["random", "trace.npz", "one-item"]) == ["one-item", "random", "trace.npz"]
    assert tuple(plots.order_variants(reversed(VARIANT_ORDER))) == VARIANT_ORDER
    assert tuple(plots.order_datasets(reversed(HOTNESS_ORDER))) == HOTNESS_ORDER


def test_speedup_and_latency_bars_draw_with_missing_cells():
    s = pd.DataFrame({"variant": ["base", "rpf", "base"], "dataset": ["medium", "medium", "random"],
                      "latency_us": [10.0, 7.0, 30.0], "latency_ci95_us": [0.1, 0.2, 0.3],
                      "speedup_vs_base": [1.0, 10 / 7, 1.0], "speedup_vs_base_ci95": [0, 0.02, 0],
                      "effective_GBps": [100.0, 140.0, 33.0]})
    for fig in (plots.latency_figure(s, "latency"), plots.speedup_figure(s, "base", "speedup"),
                plots.bandwidth_figure(s, 2039.0, "bandwidth")):
        assert _not_blank(fig)


def test_register_sweep_and_static_occupancy():
    sweep = pd.DataFrame({"variant": ["base"] * 3, "arch": ["sm_80"] * 3, "maxrregcount": [32, 42, 64],
                          "registers": [32, 42, 54], "spill_stores": [300, 56, 0], "spill_loads": [500, 168, 0],
                          "blocks_per_sm": [8, 5, 4], "theoretical_occupancy_pct": [100.0, 62.5, 50.0]})
    assert _not_blank(plots.register_sweep_figure(sweep))
    static = sweep.assign(role="lookup", variant=["base", "optmt", "warp"])
    assert _not_blank(plots.static_occupancy_figure(static))


def test_png_is_deterministic():
    s = pd.DataFrame({"variant": ["base"], "dataset": ["high"], "latency_us": [1.0], "latency_ci95_us": [0.0]})
    assert plots.png(plots.latency_figure(s, "t")) == plots.png(plots.latency_figure(s, "t"))


# ------------------------------------------------------------ figures that read right
def _overlaps_data(fig) -> list[str]:
    """Legends drawn over an axes' data area (a legend belongs outside the plot)."""
    fig.canvas.draw()
    out = []
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for leg in legends:
        box = leg.get_window_extent()
        for ax in fig.axes:
            a = ax.get_window_extent()
            if box.x0 < a.x1 - 1 and box.x1 > a.x0 + 1 and box.y0 < a.y1 - 1 and box.y1 > a.y0 + 1:
                out.append(f"legend over {ax.get_title() or 'an axes'}")
    return out


def _has_legend(fig) -> bool:
    return bool(fig.legends) or any(ax.get_legend() is not None for ax in fig.axes)


def _locality() -> dict:
    return {"one-item": {"unique_rows": 1, "rows": 1000, "lookups": 5000, "top_k_coverage": {"600": 1.0, "800": 1.0},
                         "reuse_histogram": [[-1, -1, 0.0002], [0, 1, 0.9998]]},
            "high": {"unique_rows": 300, "rows": 1000, "lookups": 5000, "top_k_coverage": {"600": 1.0, "800": 1.0},
                     "reuse_histogram": [[-1, -1, 0.06], [0, 1, 0.2], [1, 2, 0.3], [2, 4, 0.44]]},
            "random": {"unique_rows": 990, "rows": 1000, "lookups": 5000, "top_k_coverage": {"600": 0.7, "800": 0.85},
                       "reuse_histogram": [[-1, -1, 0.2], [256, 512, 0.5], [512, 1024, 0.3]]}}


def test_coverage_starts_at_one_row_and_shows_every_dataset():
    fig = plots.coverage_figure(_locality(), {"A100 L2": 800, "H100 L2": 900}, "coverage")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_xlim()[0] == 1
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert {"one-item", "high", "random"} <= set(lines)
    assert lines["one-item"].get_xdata()[0] == 1 and lines["one-item"].get_ydata()[0] == 100  # one row: all lookups
    assert lines["high"].get_xdata()[0] == 300  # every distinct row: 100%, exact
    widths = [lines[d].get_linewidth() for d in ("one-item", "high", "random")]
    assert widths == sorted(widths, reverse=True)  # coinciding curves stay visible
    assert any("A100 L2 (800 rows)" == ln.get_label() for ln in ax.get_lines())  # marks named in the legend
    assert not _overlaps_data(fig) and _not_blank(fig)


@pytest.mark.slow
def test_no_legend_over_data_and_a_legend_on_every_bar_chart():
    s = pd.DataFrame({"variant": ["base", "rpf", "base", "rpf"], "dataset": ["medium", "medium", "random", "random"],
                      "latency_us": [10.0, 7.0, 30.0, 20.0], "latency_ci95_us": [0.1, 0.2, 0.3, 0.2],
                      "speedup_vs_base": [1.0, 10 / 7, 1.0, 1.5], "speedup_vs_base_ci95": [0, 0.02, 0, 0.01],
                      "effective_GBps": [100.0, 140.0, 33.0, 50.0], "prepass_per_table_us": [0.0, 2.0, 0.0, 2.0],
                      "measured_us": [10.0, 7.0, 30.0, 20.0], "predicted_us": [9.0, 6.0, 33.0, 19.0]})
    k = pd.DataFrame({"variant": ["base", "rpf"], "dataset": ["medium"] * 2, "label": ["base · medium", "rpf · medium"],
                      "kernel_id": [0, 1], "function": ["k", "k"], "duration_ns": [4.3e6, 1e4],
                      "achieved_occupancy_pct": [40.0, 50.0], "theoretical_occupancy_pct": [50.0, 62.5],
                      "l1_hit_rate_pct": [10.0, 20.0], "l2_hit_rate_pct": [50.0, 60.0],
                      "dram_bytes_read": [28e3, 3e9], "dram_bytes_write": [43e6, 1e6],
                      "sm_throughput_pct": [20.0, 70.0], "memory_throughput_pct": [90.0, 30.0],
                      "l1_throughput_pct": [30.0, 20.0], "l2_throughput_pct": [40.0, 25.0],
                      "dram_throughput_pct": [90.6, 10.0], "stall_barrier": [1.6, 0.0], "stall_wait": [0.5, 20.0]})
    sweep = pd.DataFrame({"variant": ["base"] * 3, "arch": ["sm_80"] * 3, "maxrregcount": [32, 42, 64],
                          "registers": [32, 42, 54], "spill_stores": [300, 56, 0], "spill_loads": [500, 168, 0],
                          "blocks_per_sm": [8, 5, 4], "theoretical_occupancy_pct": [100.0, 62.5, 50.0]})
    stalls = pd.DataFrame({"variant": ["base", "base"], "dataset": ["medium"] * 2, "reason": ["barrier", "wait"],
                           "cycles": [1.6, 0.5]})
    bars = {
        "latency": plots.latency_figure(s, "latency"), "speedup": plots.speedup_figure(s, "base", "speedup"),
        "bandwidth": plots.bandwidth_figure(s, 2039.0, "bandwidth"), "prepass": plots.prepass_figure(s, "prepass"),
        "occupancy": plots.occupancy_figure(k, "occupancy"), "hit rates": plots.hit_rate_figure(k, "hit rates"),
        "dram": plots.dram_figure(k, "dram"), "stalls": plots.stall_figure(stalls, "stalls"),
        "duration": plots.kernel_duration_figure(k, "duration"),
        "kernel occupancy": plots.kernel_occupancy_figure(k, "occupancy"),
        "kernel stalls": plots.kernel_stall_figure(k, "stalls"), "sol": plots.sol_figure(k, "sol"),
        "static occupancy": plots.static_occupancy_figure(sweep.assign(role="lookup"), "static"),
        "sass": plots.sass_figure(pd.DataFrame({"variant": ["base", "rpf"], "arch": ["sm_80"] * 2,
                                                "rows_in_flight": [0.83, 2.12], "model_loads_in_flight": [1, 3]}),
                                  "sass"),
    }
    others = {"sweep": plots.register_sweep_figure(sweep), "reuse": plots.reuse_figure(_locality()),
              "pvm": plots.predicted_vs_measured_figure(s, "pvm")}
    for name, fig in {**bars, **others}.items():
        assert not _overlaps_data(fig), name
        assert _not_blank(fig), name
    for name, fig in bars.items():
        if name == "duration":   # one series, named by its axis: a legend would only repeat the label
            assert not _has_legend(fig) and fig.axes[0].get_xlabel().startswith("duration ("), name
            continue
        assert _has_legend(fig), name


def test_duration_bars_are_linear_with_distinct_labels():
    w = pd.DataFrame({"kernel_id": [0, 1, 2], "report": ["r"] * 3, "duration_ns": [16448.0, 3232.0, 33504.0],
                      "function": ["distribution_elementwise_grid_stride_kernel"] * 3})
    w["label"] = kernel_labels(w)
    fig = plots.kernel_duration_figure(w, "duration")
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(set(labels)) == 3 and labels[0].startswith("#2") and labels[-1].startswith("#1")  # longest first


@pytest.mark.parametrize("variants", [("base",), ("base", "warp"), tuple(VARIANT_ORDER)])
def test_the_dlrm_stage_chart_keeps_room_for_its_legend_however_few_variants(variants):
    """Two variants and the training step's ten stages once drew a 1.4-inch figure whose
    axes collapsed under the title, the prediction stamp and the legend."""
    import warnings

    from characterize.analysis.model.e2e import TRAINING_STAGES

    rows = pd.DataFrame([{"variant": v, "stage": st, "time_us": 100.0 + i} for v in variants
                         for i, st in enumerate(TRAINING_STAGES)])
    fig = plots.stamp(plots.e2e_stage_figure(rows, TRAINING_STAGES, "DLRM training step"), "MODEL PREDICTION")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        plots.png(fig)
    assert _has_legend(fig) and _not_blank(fig)
