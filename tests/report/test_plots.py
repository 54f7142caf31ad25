"""Figures: every builder draws something for small odd inputs, in registry order."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from matplotlib.image import imread

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
