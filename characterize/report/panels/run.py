"""Report stage, panels of a stored run: overview, locality, static, timing, Nsight Compute,
model and failures.
"""

from __future__ import annotations

import ast
import json
from typing import Any

import numpy as np
import pandas as pd

from characterize.analysis import compare as analyze
from characterize.analysis import ncu
from characterize.analysis.claims import PAPER_CLAIMS
from characterize.analysis.model.e2e import INFERENCE_STAGES, TRAINING_STAGES, stage_gmae
from characterize.analysis.model.predict import precision_grid
from characterize.analysis.model.scores import gmae
from characterize.hardware.specs import DEFAULT_GPU, HOST_LINKS
from characterize.kernels.registry import HOST_VARIANTS
from characterize.report.blocks import (
    CLAMP_NOTE,
    POINT_COLS,
    PREDICTION_STAMP,
    Cell,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    TableBlock,
    _code,
    _col,
    _figure_block,
    _isnan,
    _kv,
    _order,
    _table,
    _txt,
    clamped_any,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_x,
    kernel_table,
    rank_rules,
    rule_matrix,
    rule_texts,
    rules_beside,
    share_cell,
)
from characterize.report.layout import (
    _BENCH_HINT,
    _PROFILE_HINT,
    NEEDS,
    S_FAIL,
    S_LOCALITY,
    S_MEM,
    S_MODEL,
    S_NCU,
    S_OVERVIEW,
    S_RULES,
    S_SOL,
    S_STALLS,
    S_STATIC,
    S_TIMING,
    Panel,
    _points_missing,
    _timing_prov,
)
from characterize.report.plots import (
    bandwidth_figure,
    cache_hit_figure,
    coverage_figure,
    dram_figure,
    e2e_stage_figure,
    hit_rate_figure,
    host_bytes_figure,
    host_time_figure,
    latency_figure,
    memory_chart_figure,
    occupancy_figure,
    order_datasets,
    precision_grid_figure,
    predicted_vs_measured_figure,
    prediction_figure,
    prepass_figure,
    register_sweep_figure,
    reuse_figure,
    roofline_figure,
    sass_figure,
    sol_figure,
    speedup_figure,
    stall_figure,
    static_occupancy_figure,
)
from characterize.report.provenance import PROVENANCE, TIMING_MODES, ncu_mode_text
from characterize.report.sources import RunSource
from characterize.report.views import memory_spec
from characterize.units import format_bytes
from characterize.workloads.locality import PAPER_HOT_ROWS, named_ks


# ------------------------------------------------------------ run: overview
def _p_environment(s: RunSource) -> PanelOutput:
    m = s.meta
    gpu, env, exp = s.gpu, m.get("environment") or {}, m.get("experiment") or {}
    wl = exp.get("workload") or {}
    rows: list[tuple[str, Any]] = [("run", s.run.name), ("directory", str(s.run.path))]
    if exp:
        rows.append(("experiment", f"{exp.get('name', '?')}: {exp.get('description', '')}".rstrip(": ")))
    if wl:
        rows.append(("workload", f"T={wl.get('T')} tables x E={fmt_num(wl.get('E'))} rows x D={wl.get('D')} "
                                 f"{wl.get('dtype', 'fp32')}, B={wl.get('B')}, L={wl.get('L')}, "
                                 f"{wl.get('mode', 'sum')} pooling, {wl.get('batches')} batches, "
                                 f"seed {wl.get('seed')}"))
    for key in ("variants", "datasets", "archs", "maxrregcount"):
        if exp.get(key):
            rows.append((key, ", ".join(map(str, exp[key]))))
    if gpu:
        desc = f"{gpu.get('name', '?')} ({gpu.get('key', '?')}, {gpu.get('arch', '?')}"
        if gpu.get("sm_count"):
            desc += f", {gpu['sm_count']} SMs"
        if gpu.get("l2_bytes"):
            desc += f", L2 {gpu['l2_bytes'] / 2**20:.0f} MiB"
        if gpu.get("memory_bytes"):
            desc += f", {gpu['memory_bytes'] / 2**30:.0f} GiB"
        rows.append(("GPU", desc + ")"))
        rows += [("driver", gpu.get("driver")), ("CUDA runtime", gpu.get("cuda_runtime"))]
        clocks = []
        if gpu.get("sm_clock_MHz"):
            clocks.append(f"SM {gpu['sm_clock_MHz']} MHz")
        if gpu.get("max_sm_clock_MHz"):
            clocks.append(f"SM max {gpu['max_sm_clock_MHz']} MHz")
        if gpu.get("memory_clock_MHz"):
            clocks.append(f"memory {gpu['memory_clock_MHz']} MHz")
        rows.append(("clocks (when the run started)", ", ".join(clocks)))
        if gpu.get("hbm_GBps"):
            rows.append(("HBM peak", f"{fmt_num(gpu['hbm_GBps'])} GB/s (spec table)"))
    else:
        rows.append(("GPU", "none: no CUDA GPU was visible when the run was made"))
    backends = sorted({str(p.get("backend")) for p in s.bench_points if p.get("backend")} |
                      ({str(m["backend"])} if m.get("backend") else set()))
    if backends:
        rows.append(("timing backend", ", ".join(b + (" (CPU emulation: not GPU performance)" if b == "emulate"
                                                       else " (CUDA events on the GPU)") for b in backends)))
        rows.append(("timing clocks", "not locked (CUDA-event timings run at normal clocks)"
                     if not s.emulated else "not applicable (CPU emulation)"))
    rows += _methodology_rows(s)
    rows.append(("ncu modes (experiment)", ncu_mode_text(m.get("cache_control"), m.get("clock_control"),
                                                         (exp.get("profile") or {}).get("replay_mode"))))
    for st in s.ncu_settings:
        rows.append((f"ncu modes ({st['points']} profiled point(s))",
                     ncu_mode_text(st["cache_control"], st["clock_control"], st["replay_mode"]) +
                     f"; metric set {st['metric_set']}; scoped by {st['scoping']}"))
    versions = sorted({str(st["ncu_version"]) for st in s.ncu_settings if st["ncu_version"]})
    if versions:
        rows.append(("ncu version", ", ".join(versions)))
    if not s.static.empty and "compiler" in s.static.columns:
        rows.append(("compiler", ", ".join(sorted(set(s.static["compiler"].dropna().astype(str))))))
    sw = [f"{k} {env[k]}" for k in ("python", "torch", "numpy", "pandas") if env.get(k)]
    if env.get("torch_cuda"):
        sw.append(f"torch CUDA {env['torch_cuda']}")
    host = " ".join(x for x in (env.get("hostname"), env.get("platform")) if x)
    rows += [("software", ", ".join(sw)), ("host", host),
             ("command line", m.get("command_line")), ("git revision", env.get("git_revision")),
             ("started", m.get("started")), ("resumed", ", ".join(map(str, m.get("resumed", []))))]
    steps = m.get("steps") or {}
    if steps:
        rows.append(("steps", "; ".join(f"{k}: {v}" for k, v in steps.items())))
    return PanelOutput([_kv(rows)])


def _methodology_rows(s: RunSource) -> list[tuple[str, Any]]:
    """How the measurements were taken: timing method and launch overhead, the check
    before timing, the clock policy (flagged when bench and profile differ), the
    replay mode of each separately collected metric, and where the GPU's identity
    came from."""
    rows: list[tuple[str, Any]] = []
    ok = [p for p in s.bench_points if p.get("status") == "ok"]
    summary = [r for p in ok for r in p.get("summary", [])]
    methods = sorted({str(r["timing_method"]) for r in summary if r.get("timing_method")})
    if methods:
        gap_free = sum(bool(r.get("gap_free")) for r in summary)
        host = [r["host_launch_us"] for r in summary if r.get("host_launch_us") is not None]
        gaps = [r["launch_gap_us"] for r in summary if r.get("launch_gap_us") is not None]
        text = f"{', '.join(methods)}; {gap_free} of {len(summary)} timed mode(s) free of host gaps"
        if host:
            text += f"; launch overhead apart: host enqueue {fmt_num(float(np.mean(host)))} us per launch"
        if gaps and np.isfinite(np.nanmean(gaps)):
            text += f", device gap {fmt_num(float(np.nanmean(gaps)))} us per launch"
        rows.append(("timing method", text))
    checked = [p["check"] for p in s.bench_points if isinstance(p.get("check"), dict)]
    if checked:
        bad = sum(not c.get("passed") for c in checked)
        rows.append(("checked before timing", f"{len(checked)} point(s) against torch on their own data, "
                                              f"{bad} mismatch(es) (failed points, not timed)"))
    pol = s.clock_policies
    if pol:
        text = "; ".join(f"{stage}: --clock-control {', '.join(cs)}" for stage, cs in pol.items())
        flag = s.mixed_clocks
        rows.append(("clock policy", Cell(f"{text}. {flag}", "missing") if flag else text))
    sampled = [c for p in ok for c in ((p.get("clocks") or {}).get("before"), (p.get("clocks") or {}).get("after"))
               if c and c.get("sm_clock_MHz")]
    if sampled:
        sm = [c["sm_clock_MHz"] for c in sampled]
        throttled = sorted({r for c in sampled for r in c.get("throttle_reasons", []) if r != "gpu_idle"})
        rows.append(("clocks sampled (NVML, around each point)",
                     f"SM {min(sm)}-{max(sm)} MHz; throttle reasons: {', '.join(throttled) or 'none'}"))
    if sampled or any(p.get("throttle") for p in ok):
        hot = s.throttled_points
        rows.append(("throttled points", Cell(f"{len(hot)} of {len(ok)}: {'; '.join(hot)}", "missing") if hot
                     else f"none of {len(ok)}"))
    modes = s.replay_modes
    if modes:
        own = {m: v for m, v in modes.items() if m != "default"}
        text = f"kernel metrics: {', '.join(modes.get('default', ['?']))} replay"
        if own:
            text += "; " + ", ".join(f"{m}: {', '.join(v)} replay" for m, v in own.items())
        rows.append(("ncu replay mode per metric", text))
    ident = s.identity
    if ident:
        device = [k for k, v in ident.items() if k != "table_entry" and not str(v).startswith("spec table")]
        table = [k for k, v in ident.items() if k != "table_entry" and str(v).startswith("spec table")]
        rows.append(("GPU identity", f"from the device: {', '.join(device) or 'nothing'}; from the spec table "
                                     f"({ident.get('table_entry', '?')}): {', '.join(table) or 'nothing'}"))
    return rows


def _p_contents(s: RunSource) -> PanelOutput:
    def status(ok: bool) -> Cell:
        return Cell("present" if ok else "missing", "ok" if ok else "missing")

    bp, pp = s.bench_points, s.profile_points
    b_ok = sum(p.get("status") == "ok" for p in bp)
    p_ok = sum(p.get("status") == "ok" for p in pp)
    rows = [
        ["static characterization", status(not s.static_config.empty),
         f"{len(s.static_config)} configured kernel(s), {len(s.static_sweep)} register-sweep row(s)"
         if not s.static_config.empty else NEEDS["static"].why_missing(s), PROVENANCE["static"].label],
        ["trace locality", status(bool(s.locality_raw)),
         f"{len(s.locality_raw)} dataset(s)" if s.locality_raw else NEEDS["locality"].why_missing(s),
         PROVENANCE["trace"].label],
        ["timing", status(b_ok > 0), f"{b_ok} point(s) timed, {len(bp) - b_ok} failed" if bp else
         _points_missing(s, "bench", _BENCH_HINT), PROVENANCE[s.timing_provenance].label if bp else ""],
        ["Nsight Compute profile", status(p_ok > 0 and not s.metrics.empty),
         f"{p_ok} point(s) profiled, {len(pp) - p_ok} failed" +
         (f", {len(s.unreadable_reports)} report(s) unreadable (see Failures)" if s.unreadable_reports else "")
         if pp else _points_missing(s, "profile", _PROFILE_HINT),
         PROVENANCE["ncu"].label if pp else ""],
        ["model predictions", status(not s.predictions.empty),
         f"{len(s.predictions)} prediction row(s)" if not s.predictions.empty else NEEDS["predictions"].why_missing(s),
         PROVENANCE["model"].label if not s.predictions.empty else ""],
    ]
    return PanelOutput([TableBlock(["data", "status", "details", "provenance"],
                                   [[c if isinstance(c, Cell) else Cell(str(c)) for c in r] for r in rows])])


def _speedup_ci_table(s: RunSource, mode: str) -> pd.DataFrame:
    return analyze.speedups(s.bench_ok, mode, against=("base",))


def _p_headline(s: RunSource) -> PanelOutput:
    if s.bench_ok.empty:
        return _predicted_headline_panel(s)
    if not (s.bench_ok["variant"] == "base").any():
        raise Missing("the reference variant base was not timed, so there is no speedup over base")
    blocks: list[Any] = []
    if s.emulated:
        blocks.append(NoteBlock("These ratios come from CPU emulation. They check that the harness works and say "
                                "NOTHING about GPU performance: do not compare them with the paper's claims.",
                                "warning"))
    claims = {k: c.text for k, c in PAPER_CLAIMS.items()}
    for mode in s.modes:
        table = analyze.headline(s.bench_ok, mode)
        if table.empty:
            continue
        ci = _speedup_ci_table(s, mode).set_index(["variant", "dataset"])
        datasets = list(table.columns)
        rows = []
        for v in _order(pd.DataFrame({"variant": table.index}))["variant"]:
            cells = [Cell(v, "code")]
            vals = []
            for d in datasets:
                x = table.loc[v, d]
                c = ci["speedup_vs_base_ci95"].get((v, d), np.nan) if (v, d) in ci.index else np.nan
                vals.append(x)
                cells.append(Cell(fmt_x(x, c), "num" + (" good" if not _isnan(x) and x > 1.02 else
                                                        " bad" if not _isnan(x) and x < 0.98 else "")))
            best = np.nanmax(vals) if any(not _isnan(x) for x in vals) else np.nan
            cells.append(Cell("–" if _isnan(best) else f"{100 * (best - 1):+.0f}%", "num"))
            cells.append(Cell(claims.get(v, ""), "claim"))
            rows.append(cells)
        blocks.append(TableBlock(["variant"] + datasets + ["best over base", "paper (A100, embedding stage)"], rows,
                                 caption=f"Speedup over base, {TIMING_MODES.get(mode, mode)} "
                                         f"({PROVENANCE[s.timing_provenance].label})",
                                 note="ratio of mean per-table latencies (> 1: faster than base) with a 95% CI"))
    slow = analyze.slowdown_random_vs_one_item(s.bench_ok)
    if not _isnan(slow):
        blocks.append(NoteBlock(f"base: random access is {slow:.2f}x slower than one-item (steady mode); paper: "
                                f"{claims.get('random_vs_one_item', '')}."))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


def predicted_speedups(p: pd.DataFrame) -> pd.DataFrame:
    """Predicted speedup over base per (gpu, variant, dataset) with the model's band:
    base and variant times taken at the same end of the band (the constants move both),
    the band spanning the speedups at the low end, the middle and the high end."""
    keys = [c for c in ("gpu", "mode", "dataset") if c in p.columns]
    base = p[p["variant"] == "base"]
    if base.empty or "time_us" not in p.columns:
        out = p.copy()
        out["speedup_low"] = out["speedup_high"] = np.nan
        return out
    cols = [c for c in ("time_us", "time_us_low", "time_us_high") if c in p.columns]
    m = p.merge(base[keys + cols], on=keys, how="left", suffixes=("", "_base"))
    m["speedup"] = m["time_us_base"] / m["time_us"]
    if {"time_us_low", "time_us_high"} <= set(p.columns):
        ends = pd.concat([m["time_us_low_base"] / m["time_us_low"], m["speedup"],
                          m["time_us_high_base"] / m["time_us_high"]], axis=1)
        m["speedup_low"], m["speedup_high"] = ends.min(axis=1), ends.max(axis=1)
    else:
        m["speedup_low"] = m["speedup_high"] = np.nan
    return m


def _predicted_headline_panel(s: RunSource) -> PanelOutput:
    """With nothing measured, the headline shows the model's predictions with their bands."""
    p = s.primary_predictions
    if p.empty or not {"variant", "dataset", "time_us"} <= set(p.columns):
        raise Missing(_points_missing(s, "bench", _BENCH_HINT) + " No model predictions either (predictions.csv).")
    if "mode" in p.columns and (p["mode"] == "steady").any():
        p = p[p["mode"] == "steady"]
    sp = predicted_speedups(p)
    banded = sp["speedup_low"].notna().any()
    blocks: list[Any] = [NoteBlock(
        "Nothing was measured in this run: these are the MODEL'S PREDICTIONS, not measurements"
        + (" (in brackets: the band the model's constants allow)" if banded else
           " (this predictions.csv carries no band: time_us_low/time_us_high)") + ". "
        + _points_missing(s, "bench", _BENCH_HINT), "prediction")]
    claims = {k: c.text for k, c in PAPER_CLAIMS.items()}
    gpus = list(dict.fromkeys(sp["gpu"].astype(str))) if "gpu" in sp.columns else [""]
    for gpu in gpus[:3]:
        d = sp[sp["gpu"].astype(str) == gpu] if gpu else sp
        datasets = order_datasets(d["dataset"])
        rows = []
        for v in _order(pd.DataFrame({"variant": d["variant"].unique()}))["variant"]:
            cells, vals = [Cell(v, "code")], []
            for ds in datasets:
                r = d[(d["variant"] == v) & (d["dataset"] == ds)]
                if r.empty:
                    cells.append(Cell("–", "num"))
                    continue
                x, lo, hi = r["speedup"].iloc[0], r["speedup_low"].iloc[0], r["speedup_high"].iloc[0]
                vals.append(x)
                band = "" if _isnan(lo) else f" [{lo:.2f}–{hi:.2f}]"
                cells.append(Cell(f"{x:.2f}×{band}" if not _isnan(x) else "–", "num"))
            best = max((x for x in vals if not _isnan(x)), default=np.nan)
            cells.append(Cell("–" if _isnan(best) else f"{100 * (best - 1):+.0f}%", "num"))
            cells.append(Cell(claims.get(v, ""), "claim"))
            rows.append(cells)
        blocks.append(TableBlock(["variant"] + datasets + ["best over base (predicted)",
                                                            "paper (A100, embedding stage)"], rows,
                                 caption=f"PREDICTED speedup over base{' on ' + gpu if gpu else ''}, steady mode "
                                         "(model prediction, not a measurement)"))
    return PanelOutput(blocks, provenance=("model",), modes="model: steady mode (L2 warm between batches)")


# -------------------------------------------------------------- run: locality
def _l2_marks(s: RunSource, row_bytes: int | None) -> dict[str, int]:
    if not row_bytes:
        return {}
    archs = [a for a in (s.meta.get("experiment") or {}).get("archs", []) if a in DEFAULT_GPU]
    return {name: k for name, k in named_ks(row_bytes, archs).items() if name.endswith(" L2")
            and "persisting" not in name}


def _p_locality(s: RunSource) -> PanelOutput:
    raw = s.locality_raw
    names = order_datasets(raw)
    stored = {int(k) for d in raw.values() for k in (d.get("top_k_coverage") or {})}
    # the table names the K that mean something (the paper's, the GPUs' L2); the figure draws the curve
    row_bytes = next((d.get("row_bytes") for d in raw.values() if d.get("row_bytes")), None)
    named = {PAPER_HOT_ROWS, *_l2_marks(s, row_bytes).values()}
    ks = sorted(stored & named) or sorted(stored)[-4:]
    qs = [q for q in ("p50", "p90", "p99") if any(q in (d.get("reuse_distance_quantiles") or {}) for d in raw.values())]
    rows = []
    for ds in names:
        d = raw[ds]
        rows.append({"dataset": ds, **d, **{f"top_{k}": (d.get("top_k_coverage") or {}).get(str(k)) for k in ks},
                     **{f"q_{q}": (d.get("reuse_distance_quantiles") or {}).get(q) for q in qs}})
    spec = [("dataset", lambda r: Cell(r["dataset"], "code")),
            ("lookups", _col("lookups")),
            ("unique rows", lambda r: Cell(fmt_num(r.get("unique_rows")) + (
                f" ({100 * r['unique_rows'] / r['rows']:.1f}% of {fmt_num(r['rows'])})" if r.get("rows") else ""),
                "num")),
            ("first reads", lambda r: Cell(fmt_pct(100 * r["cold_fraction"]) if not _isnan(r.get("cold_fraction"))
                                           else "–", "num"))]
    spec += [(f"top-{k:,} coverage", (lambda k: lambda r: Cell(fmt_pct(100 * r[f"top_{k}"])
                                                                if not _isnan(r.get(f"top_{k}")) else "–", "num"))(k))
             for k in ks]
    spec += [(f"reuse {q}", _col(f"q_{q}")) for q in qs]
    spec += [("bytes touched", _col("bytes_touched", format_bytes))]
    blocks: list[Any] = [_table(rows, spec, caption="One table of each dataset (tables share a distribution)",
                                note="reuse distance: distinct rows read between two reads of the same row; "
                                     "top-K coverage: fraction of lookups that hit the K most frequent rows")]
    descs = [(ds, raw[ds].get("description")) for ds in names if raw[ds].get("description")]
    if descs:
        blocks.append(_kv(descs, caption="Dataset definitions"))
    row_bytes = next((d.get("row_bytes") for d in raw.values() if d.get("row_bytes")), None)
    ks = sorted({int(k) for d in raw.values() for k in (d.get("top_k_coverage") or {})})
    blocks.append(_figure_block(coverage_figure(raw, _l2_marks(s, row_bytes), "Top-K coverage per dataset"),
                                "Top-K coverage", "markers: the K values locality.json stores (" +
                                ", ".join(f"{k:,}" for k in ks) + ") and K = unique rows (100%, exact); vertical "
                                "lines: rows of this size that fill each target GPU's L2. Coverage below the "
                                "smallest stored K is not stored, so it is not drawn"))
    if any(d.get("reuse_histogram") for d in raw.values()):
        blocks.append(_figure_block(reuse_figure(raw, "Reuse-distance distribution"), "Reuse-distance distribution",
                                    "log2 bins; first reads (no earlier read) in the legend"))
    return PanelOutput(blocks)


# ---------------------------------------------------------------- run: static
def _p_static(s: RunSource) -> PanelOutput:
    d = _order(s.static_config)
    spec = [("variant", lambda r: Cell(str(r["variant"]), "code")), ("arch", _col("arch", _txt, "")),
            ("role", _col("role", _txt, "")),
            ("cap", lambda r: Cell("none" if _isnan(r.get("maxrregcount")) else fmt_num(r["maxrregcount"]), "num")),
            ("kernel", lambda r: Cell(_txt(r.get("kernel")), "code")),
            ("registers", _col("registers")), ("spill stores (B)", _col("spill_stores")),
            ("spill loads (B)", _col("spill_loads")), ("stack (B)", _col("stack_frame")),
            ("shared (B)", _col("shared_mem")), ("block", _col("block_size")), ("blocks/SM", _col("blocks_per_sm")),
            ("theoretical occupancy", _col("theoretical_occupancy_pct", fmt_pct)),
            ("limiter", _col("limiter", _txt, ""))]
    blocks: list[Any] = [_table(d, spec, caption="Kernels as each variant is configured (cap: -maxrregcount)")]
    look = d[d["role"] == "lookup"] if "role" in d.columns else d
    if not look.empty and "theoretical_occupancy_pct" in look.columns:
        blocks.append(_figure_block(static_occupancy_figure(look, "Theoretical occupancy of the lookup kernels"),
                                    "Theoretical occupancy", f"{PROVENANCE['static'].label}: ptxas + occupancy "
                                    "calculator; no caches or clocks involved"))
    return PanelOutput(blocks)


def _p_sweep(s: RunSource) -> PanelOutput:
    d = _order(s.static_sweep)
    fig = register_sweep_figure(d, "Register sweep")
    spec = [("variant", lambda r: Cell(str(r["variant"]), "code")), ("arch", _col("arch", _txt, "")),
            ("-maxrregcount", _col("maxrregcount")), ("registers", _col("registers")),
            ("spill st/ld (B)", lambda r: Cell(f"{fmt_num(r.get('spill_stores'))} / {fmt_num(r.get('spill_loads'))}",
                                               "num")),
            ("blocks/SM", _col("blocks_per_sm")), ("theoretical occupancy", _col("theoretical_occupancy_pct", fmt_pct)),
            ("limiter", _col("limiter", _txt, ""))]
    return PanelOutput([
        _figure_block(fig, "Register sweep", f"{PROVENANCE['static'].label}: each cap compiled with nvcc; "
                      "no caches or clocks involved"),
        DetailsBlock(f"Register-sweep table ({len(d)} rows)", [_table(d, spec)])])


def _load_bits_text(v: Any) -> str:
    """'{32: 2, 128: 4}' (or a dict, or JSON) as '4 x 128-bit, 2 x 32-bit'."""
    if _isnan(v) or v == "":
        return "–"
    d = v
    if isinstance(v, str):
        try:
            d = json.loads(v.replace("'", '"'))
        except ValueError:
            try:
                d = ast.literal_eval(v)
            except (ValueError, SyntaxError):
                return v
    if isinstance(d, dict):
        items = sorted(((int(k), int(n)) for k, n in d.items()), reverse=True)
        return ", ".join(f"{n} × {b}-bit" for b, n in items) or "none"
    return str(d)


def sass_view(s: RunSource) -> pd.DataFrame:
    """The lookup kernels' hot loops (sass.csv) beside the model's assumption (loads in
    flight, predictions.csv, per variant x arch) and the measured long-scoreboard stall
    (ncu, per variant, where the run's GPU has the row's architecture)."""
    d = s.sass.copy()
    if "role" in d.columns:
        d = d[d["role"].fillna("lookup").astype(str) == "lookup"]
    d["variant"] = d["variant"].astype(str)
    d["arch"] = d["arch"].astype(str)
    p = s.primary_predictions
    if not p.empty and {"variant", "arch", "loads_in_flight"} <= set(p.columns):
        g = p.groupby(["variant", "arch"])["loads_in_flight"]
        m = pd.DataFrame({"model_loads_in_flight": g.median(), "model_lo": g.min(), "model_hi": g.max()}).reset_index()
        m["variant"], m["arch"] = m["variant"].astype(str), m["arch"].astype(str)
        d = d.merge(m, on=["variant", "arch"], how="left")
    k = s.lookup_view
    arch = s.gpu.get("arch")
    if not k.empty and "stall_long_scoreboard" in k.columns and arch:
        ls = k.groupby("variant")["stall_long_scoreboard"].mean().rename("measured_long_scoreboard").reset_index()
        ls["arch"] = str(arch)
        d = d.merge(ls, on=["variant", "arch"], how="left")
    return _order(d)


def _sass_verdict(r: dict) -> str:
    notes = []
    sass, model = r.get("rows_in_flight"), r.get("model_loads_in_flight")
    if not _isnan(sass) and not _isnan(model) and float(sass) > 0:
        ratio = float(model) / float(sass)
        if ratio > 1.25:
            notes.append(f"the model assumes {ratio:.1f}x the rows in flight the SASS keeps")
        elif ratio < 0.8:
            notes.append(f"the SASS keeps {1 / ratio:.1f}x the rows in flight the model assumes")
        else:
            notes.append("model and SASS agree")
    spills = r.get("local_mem_ops")
    if not _isnan(spills) and float(spills) > 0:
        notes.append(f"{int(spills)} spill access(es) (LDL/STL) per iteration")
    return "; ".join(notes) or "–"


def _sass_prov(s: RunSource) -> tuple[str, ...]:
    prov: tuple[str, ...] = ("static",)
    if not s.predictions.empty and "loads_in_flight" in s.predictions.columns:
        prov += ("model",)
    if not s.lookup_view.empty:
        prov += ("ncu",)
    return prov


def _p_sass(s: RunSource) -> PanelOutput:
    d = sass_view(s)
    if d.empty:
        raise Missing("sass.csv has no lookup-kernel rows")
    lacking = [c for c in ("rows_in_flight", "row_loads", "local_mem_ops") if c not in d.columns]
    blocks: list[Any] = []
    if "rows_in_flight" in d.columns and d["rows_in_flight"].notna().any():
        blocks.append(_figure_block(sass_figure(d, "Rows in flight per warp in the hot loop"), "Rows in flight",
                                    "blue: read from the SASS by an in-order replay of the hot loop (static "
                                    "analysis)" + ("; orange: what the model assumes (model prediction input)"
                                                   if "model_loads_in_flight" in d.columns else "")))
    spec = [("variant", lambda r: Cell(str(r["variant"]), "code")), ("arch", _col("arch", _txt, "")),
            ("rows in flight (SASS)", _col("rows_in_flight")),
            ("model assumes", lambda r: Cell(
                fmt_num(r.get("model_loads_in_flight")) + (
                    f" ({fmt_num(r['model_lo'])}–{fmt_num(r['model_hi'])})"
                    if not _isnan(r.get("model_lo")) and r.get("model_lo") != r.get("model_hi") else ""), "num")),
            ("long-scoreboard (ncu, cycles/inst)", _col("measured_long_scoreboard")),
            ("reading", lambda r: Cell(_sass_verdict(r), "")),
            ("spills in loop (LDL/STL)", _col("local_mem_ops")),
            ("loads by width", lambda r: Cell(_load_bits_text(r.get("load_bits")), "num")),
            ("row / index loads", lambda r: Cell(f"{fmt_num(r.get('row_loads'))} / {fmt_num(r.get('index_loads'))}",
                                                 "num")),
            ("latencies / iteration", _col("latencies_per_iteration")),
            ("instructions / iteration", _col("instructions")),
            ("kernel", lambda r: Cell(_txt(r.get("kernel")), "code"))]
    blocks.append(_table(d, spec, caption="Hot loop of each lookup kernel (sass.csv)",
                         note="rows in flight per warp = row loads per iteration / memory latencies serialized per "
                              "iteration (in-order replay of the loop's SASS); model assumes: loads_in_flight of "
                              "predictions.csv; long-scoreboard: measured on the run's GPU when profiled, mean over "
                              "its datasets (– when not measured or another architecture)"))
    if "model_loads_in_flight" not in d.columns:
        blocks.append(NoteBlock("predictions.csv has no loads_in_flight column, so the model's assumption cannot be "
                                "shown beside the SASS."))
    if s.lookup_view.empty:
        blocks.append(NoteBlock("Not measured: no Nsight Compute profile in this run, so no long-scoreboard stall "
                                "to set beside the SASS. " + _points_missing(s, "profile", _PROFILE_HINT)))
    if lacking:
        blocks.append(NoteBlock("sass.csv lacks the column(s) " + ", ".join(lacking) + "."))
    return PanelOutput(blocks)


# ---------------------------------------------------------------- run: timing
def _p_latency(s: RunSource) -> PanelOutput:
    blocks: list[Any] = []
    prov = PROVENANCE[s.timing_provenance].label
    for mode in s.modes:
        sp = _order(analyze.speedups(s.bench_ok, mode))
        if sp.empty:
            continue
        blocks.append(_figure_block(latency_figure(sp, f"Latency per table launch, {mode}"),
                                    f"Latency ({mode})", f"{prov}; {s.timing_mode(mode)}; error bars: 95% CI",
                                    stamp=s.timing_stamp))
        spec = [*POINT_COLS,
                ("latency (µs)", lambda r: Cell(fmt_ci(r["latency_us"], r["latency_ci95_us"]), "num")),
                ("reps", _col("reps")), ("stable", lambda r: Cell(fmt_num(r.get("stable")), "")),
                ("vs base", lambda r: Cell(fmt_x(r.get("speedup_vs_base"), r.get("speedup_vs_base_ci95")), "num")),
                ("vs torch", lambda r: Cell(fmt_x(r.get("speedup_vs_torch"), r.get("speedup_vs_torch_ci95")), "num"))]
        blocks.append(_table(sp, spec, caption=f"{mode}: latency per table launch (mean ± 95% CI) and speedups "
                                               f"(> 1: faster) — {prov}",
                             note="stable: the CI is within the experiment's target"))
    if s.emulated:
        blocks.insert(0, NoteBlock("CPU-emulation timings: they check the harness, NOT GPU performance.", "warning"))
    elif s.throttled_points:
        blocks.insert(0, NoteBlock(f"Throttled while timed (power or thermal limit, NVML): "
                                   f"{'; '.join(s.throttled_points)}. These points ran below the GPU's normal "
                                   "clocks; compare them with care, or bench them again once the GPU is cool.",
                                   "warning"))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


def _p_speedup(s: RunSource) -> PanelOutput:
    blocks: list[Any] = []
    prov = PROVENANCE[s.timing_provenance].label
    for mode in s.modes:
        sp = _order(analyze.speedups(s.bench_ok, mode))
        for ref in ("base", "torch"):
            col = f"speedup_vs_{ref}"
            if sp.empty or col not in sp.columns or sp[col].notna().sum() == 0:
                blocks.append(NoteBlock(f"{mode}: no speedup over {ref}: {ref} was not timed in this mode."))
                continue
            blocks.append(_figure_block(speedup_figure(sp, ref, f"Speedup over {ref}, {mode}"),
                                        f"Speedup over {ref} ({mode})",
                                        f"{prov}; {s.timing_mode(mode)}; ratio of means, error bars: 95% CI "
                                        "(delta method)", stamp=s.timing_stamp))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


def _p_bandwidth(s: RunSource) -> PanelOutput:
    peak = s.gpu.get("hbm_GBps")
    blocks: list[Any] = []
    if peak:
        blocks.append(NoteBlock(f"HBM peak of {s.gpu.get('name') or s.gpu.get('key') or 'the GPU'}: "
                                f"{fmt_num(peak)} GB/s (vendor figure from the spec table); a gather that reads "
                                "each row once cannot beat it, so the gap shows how latency-bound a point is."))
    else:
        blocks.append(NoteBlock("No GPU peak bandwidth is recorded for this run (meta.json has no GPU), so the "
                                "effective bandwidth is shown without the HBM peak line."))
    prov = PROVENANCE[s.timing_provenance].label
    for mode in s.modes:
        sp = _order(analyze.speedups(s.bench_ok, mode))
        if sp.empty or "effective_GBps" not in sp.columns:
            continue
        sp = sp.copy()
        sp["peak_pct"] = 100 * sp["effective_GBps"] / peak if peak else np.nan
        blocks.append(_figure_block(bandwidth_figure(sp, peak, f"Effective bandwidth against the HBM peak, {mode}"),
                                    f"Effective bandwidth ({mode})",
                                    f"{prov}; {s.timing_mode(mode)}; effective bandwidth = bytes a table launch must "
                                    "move (rows gathered + indices + offsets + output) / its mean time",
                                    stamp=s.timing_stamp))
        spec = [*POINT_COLS,
                ("effective GB/s", _col("effective_GBps")),
                ("% of HBM peak", lambda r: Cell(fmt_pct(r.get("peak_pct")), "num"))]
        blocks.append(DetailsBlock(f"{mode}: effective bandwidth table", [_table(sp, spec)]))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


PREPASS_VARIANTS = ("l2p", "l2w", "combined")


def _p_prepass(s: RunSource) -> PanelOutput:
    b = s.bench_ok
    if not (b["variant"] == "base").any():
        raise Missing("base was not timed, so there is no speedup over base")
    if not b["variant"].isin(PREPASS_VARIANTS).any():
        raise Missing("no variant with an L2 pre-pass or window (l2p, l2w, combined) was timed in this run")
    blocks: list[Any] = []
    prov = PROVENANCE[s.timing_provenance].label
    for mode in s.modes:
        ex = analyze.speedups(b, mode, against=("base",))
        inc = analyze.speedups(b, mode, against=("base",), include_prepass=True)
        if ex.empty:
            continue
        m = ex.merge(inc[["variant", "dataset", "latency_us", "latency_ci95_us", "speedup_vs_base",
                          "speedup_vs_base_ci95"]], on=["variant", "dataset"], suffixes=("", "_incl"))
        m = _order(m[m["variant"].isin(PREPASS_VARIANTS + ("base",))])
        if "prepass_per_table_us" not in m.columns:
            m["prepass_per_table_us"] = np.nan
        spec = [*POINT_COLS,
                ("kernel (µs)", lambda r: Cell(fmt_ci(r["latency_us"], r["latency_ci95_us"]), "num")),
                ("pre-pass (µs)", _col("prepass_per_table_us")),
                ("kernel + pre-pass (µs)",
                 lambda r: Cell(fmt_ci(r["latency_us_incl"], r["latency_ci95_us_incl"]), "num")),
                ("vs base, pre-pass excluded",
                 lambda r: Cell(fmt_x(r["speedup_vs_base"], r["speedup_vs_base_ci95"]), "num")),
                ("vs base, pre-pass included", lambda r: Cell(fmt_x(r["speedup_vs_base_incl"],
                                                                    r["speedup_vs_base_ci95_incl"]), "num"))]
        pm = m[m["variant"].isin(PREPASS_VARIANTS)]
        blocks.append(_figure_block(prepass_figure(pm, f"Lookup kernel and L2 pre-pass per table launch, {mode}"),
                                    f"Pre-pass ({mode})", f"{prov}; {s.timing_mode(mode)}",
                                    stamp=s.timing_stamp))
        blocks.append(_table(m, spec, caption=f"{mode}: pre-pass excluded (as the paper reports) and included "
                                              f"— {prov}"))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


# ------------------------------------------------------------------- run: ncu
def _ncu_groups(s: RunSource) -> list[tuple[str, Any, Any, pd.DataFrame]]:
    """(mode text, cache, clock, per-point means of the lookup kernels) per collection mode
    (computed once per source: every ncu panel reads them)."""
    cached = s.__dict__.get("_ncu_groups")
    if cached is None:
        cached = s.__dict__["_ncu_groups"] = _compute_ncu_groups(s)
    return cached


def _compute_ncu_groups(s: RunSource) -> list[tuple[str, Any, Any, pd.DataFrame]]:
    k = s.lookup_view
    if k.empty:
        raise Missing("no lookup kernels among the profiled kernels")
    k = k.copy()
    for c in ("cache_control", "clock_control"):
        if c not in k.columns:
            k[c] = ""
        k[c] = k[c].fillna("").astype(str)
    out = []
    for (cache, clock), g in k.groupby(["cache_control", "clock_control"], sort=True):
        out.append((s.ncu_mode(cache or None, clock or None), cache, clock, _order(ncu.per_point(g))))
    return out


def _ncu_prov_modes(s: RunSource) -> str:
    return "; ".join(mode for mode, *_ in _ncu_groups(s))


def _ranked_rules(s: RunSource) -> tuple[pd.DataFrame, list[str], dict[str, str], bool]:
    """ncu's findings over every point, ranked (a point's weight: its share of the run's profiled time)."""
    r = s.rules
    if r.empty:
        return pd.DataFrame(), [], {}, False
    points = list(dict.fromkeys(_order(r[["variant", "dataset", "point"]].drop_duplicates())["point"]))
    return rank_rules(r, "point"), points, {p: p for p in points}, False


def _beside(s: RunSource, topic: str) -> list[Any]:
    ranked, points, names, weighted = _ranked_rules(s)
    return rules_beside(ranked, topic, points, names, weighted)


def _p_sol(s: RunSource) -> PanelOutput:
    blocks: list[Any] = []
    for mode, _, _, agg in _ncu_groups(s):
        if agg[["sm_throughput_pct", "memory_throughput_pct"]].isna().all().all():
            blocks.append(NoteBlock(f"No speed-of-light metrics in the reports ({mode})."))
            continue
        blocks.append(_figure_block(sol_figure(agg, "Speed of light of the lookup kernels (% of peak)"),
                                    "Speed of light", f"mean over the profiled launches of each point; below "
                                    f"{ncu.BOUND_PCT:.0f}% a unit does not limit the kernel"))
        spec = [*POINT_COLS, ("launches", _col("kernels")),
                ("duration per launch (µs, under ncu)", lambda r: Cell(fmt_num(r.get("duration_ns") / 1e3), "num")),
                ("SM", _col("sm_throughput_pct", fmt_pct)), ("memory", _col("memory_throughput_pct", fmt_pct)),
                ("L1/TEX", _col("l1_throughput_pct", fmt_pct)), ("L2", _col("l2_throughput_pct", fmt_pct)),
                ("DRAM", _col("dram_throughput_pct", fmt_pct)),
                ("bound", lambda r: Cell(_txt(r.get("bound")), "", title=_txt(r.get("bound_why"))))]
        blocks.append(_table(agg, spec, caption=f"Throughput as % of peak sustained per point — {mode}",
                             note=f"bound: both SM and memory below {ncu.BOUND_PCT:.0f}% -> latency-bound (the "
                                  "stalls say on what); durations under the profiler are not latencies (Timing)"))
    return PanelOutput(blocks + _beside(s, "sol"), modes=_ncu_prov_modes(s))


def _p_roofline(s: RunSource) -> PanelOutput:
    pts, roofs = ncu.roofline(_order(ncu.per_point(s.lookup_view, ("variant", "dataset"))))
    if pts.empty:
        raise Missing("no lookup kernel executed floating-point work the roofline counters saw")
    blocks: list[Any] = [_figure_block(roofline_figure(pts, roofs, "Roofline of the lookup kernels"), "Roofline",
                                       "ceilings from ncu's peak counters at the clocks the kernels ran at; one "
                                       "marker per point (mean launch)")]
    spec = [("point", lambda r: Cell(_txt(r["label"]), "code")), ("precision", _col("precision", _txt, "")),
            ("achieved GFLOP/s", _col("flop_per_s", lambda v: fmt_num(v / 1e9))),
            ("DRAM intensity (FLOP/B)", _col("dram_intensity_flop_per_byte"))]
    blocks.append(_table(pts, spec, caption="Achieved work and arithmetic intensity"))
    return PanelOutput(blocks, modes=_ncu_prov_modes(s))


def _p_occupancy(s: RunSource) -> PanelOutput:
    blocks: list[Any] = []
    for mode, _, _, agg in _ncu_groups(s):
        blocks.append(_figure_block(occupancy_figure(agg, "Achieved vs theoretical occupancy (lookup kernels)"),
                                    "Occupancy", "mean over the profiled launches of each point"))
        spec = [*POINT_COLS,
                ("launches", _col("kernels")), ("registers/thread", _col("registers_per_thread")),
                ("theoretical", _col("theoretical_occupancy_pct", fmt_pct)),
                ("achieved", _col("achieved_occupancy_pct", fmt_pct))]
        blocks.append(_table(agg, spec, caption=f"Mean over the profiled lookup kernels of each point — {mode}"))
    return PanelOutput(blocks + _beside(s, "occupancy"), modes=_ncu_prov_modes(s))


def _p_stalls(s: RunSource) -> PanelOutput:
    blocks: list[Any] = []
    for mode, _, _, agg in _ncu_groups(s):
        long = ncu.weighted_stalls(agg)
        if long.empty or long["cycles_per_issue"].sum() == 0:
            blocks.append(NoteBlock(f"No warp-stall metrics in the reports ({mode}); the WarpStateStats section "
                                    "was not collected."))
            continue
        reasons = ncu.top_reasons(long, 7)
        blocks.append(_figure_block(stall_figure(long.rename(columns={"cycles_per_issue": "cycles"}),
                                                 "Warp-stall breakdown per launch (lookup kernels)", keep=reasons),
                                    "Warp stalls", "cycles per issued instruction (smsp__average_warps_issue_"
                                    "stalled_*_per_issue_active), mean launch per point; reasons picked by their "
                                    "stall cycles weighted by instructions issued"))
        wide = long.pivot_table(index=["variant", "dataset"], columns="reason", values="cycles_per_issue").reset_index()
        shares = long.groupby(["variant", "dataset"], as_index=False)["total_share_pct"].sum()
        wide = wide.merge(shares, on=["variant", "dataset"], how="left")
        wide["total"] = wide[[c for c in wide.columns if c not in ("variant", "dataset", "total_share_pct")]].sum(
            axis=1)
        spec = list(POINT_COLS)
        spec += [(r.replace("_", " "), _col(r)) for r in reasons[:6]] + [("all reasons", _col("total")),
                                                                           ("share of stall cycles",
                                                                            lambda r: share_cell(r["total_share_pct"]))]
        blocks.append(_table(_order(wide), spec,
                             caption=f"Stall cycles per issued instruction, largest weighted reasons — {mode}",
                             note="share of stall cycles: the point's warp-cycles stalled (x instructions issued) "
                                  "over all points'; 'selected' (issuing) is not a stall"))
    return PanelOutput(blocks + _beside(s, "stalls"), modes=_ncu_prov_modes(s))


def _p_memory(s: RunSource) -> PanelOutput:
    blocks: list[Any] = []
    for mode, cache, _, agg in _ncu_groups(s):
        if cache != "none":
            blocks.append(NoteBlock(f"{mode}: L2 pinning is invisible under this mode: caches were flushed before "
                                    "each kernel."))
        top = ncu.slowest(agg, 4).to_dict("records")
        charts = [_figure_block(memory_chart_figure(r, f"Memory chart: {r['label']} (mean launch)"),
                                f"Memory chart of {r['label']}", "requests, sectors (32 B) and bytes between the "
                                "units, reads above, writes below; hit rates in the caches") for r in top]
        if charts:
            blocks.append(charts[0])
        if len(charts) > 1:
            blocks.append(DetailsBlock(f"Memory charts of the next {len(charts) - 1} point(s) by duration",
                                       charts[1:]))
        rates = ["l1_hit_rate_pct", "l2_hit_rate_pct"]
        if set(rates) <= set(agg.columns) and agg[rates].notna().any().any():
            blocks.append(_figure_block(hit_rate_figure(agg, "L1 and L2 hit rates (lookup kernels)"), "Hit rates",
                                        "sector hit rates, mean launch per point"))
        if agg[["dram_bytes_read", "dram_bytes_write"]].notna().any().any():
            blocks.append(_figure_block(dram_figure(agg, "DRAM bytes read and written (lookup kernels)"),
                                        "DRAM bytes", "per launch, mean over the profiled launches"))
        spec = [*POINT_COLS] + memory_spec() + [
            ("duration (µs, under ncu)", lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num"))]
        blocks.append(_table(agg, spec, caption=f"Memory workload per point (mean launch) — {mode}",
                             note=(CLAMP_NOTE if clamped_any(agg) else "'no traffic': no sector went through that "
                                   "cache (not a 0% hit rate).") + " Durations under the profiler (replay, locked "
                                  "clocks) are not latencies; the Timing section has those."))
    return PanelOutput(blocks + _beside(s, "memory"), modes=_ncu_prov_modes(s))


def _p_kernels(s: RunSource) -> PanelOutput:
    k = _order(s.kview)
    return PanelOutput([kernel_table(k, "Every profiled kernel (lookup kernels and L2 pre-pass kernels)")],
                       modes=_ncu_prov_modes(s))


def _p_rules(s: RunSource) -> PanelOutput:
    points = [p for p in s.profile_points if p.get("status") == "ok" and p.get("report")]
    if not points:
        raise Missing(_points_missing(s, "profile", _PROFILE_HINT))
    r = s.rules
    blocks: list[Any] = [NoteBlock(e, "warning") for e in s.rule_errors]
    if r.empty:
        blocks.append(NoteBlock("The reports hold no rule findings."))
        return PanelOutput(blocks, modes=_ncu_prov_modes(s))
    ranked, cols, names, weighted = _ranked_rules(s)
    if ranked.empty:
        blocks.append(NoteBlock(f"ncu's {len(r)} rule result(s) hold no finding (all OK or informational)."))
    else:
        blocks.append(rule_matrix(ranked, cols, names, f"{len(ranked)} finding(s) x {len(cols)} point(s), ranked "
                                                       "(each point: every kernel of its report)", weighted))
        blocks.append(rule_texts(ranked, names))
    return PanelOutput(blocks, modes=_ncu_prov_modes(s))


# ----------------------------------------------------------------- run: model
def _predicted_headline(d: pd.DataFrame, gpu: str) -> TableBlock:
    """Technique x hotness -> predicted speedup over base, beside the paper's claims."""
    table = d.pivot_table(index="variant", columns="dataset", values="speedup_vs_base", aggfunc="mean")
    datasets = order_datasets(table.columns)
    rows = []
    for v in _order(pd.DataFrame({"variant": table.index}))["variant"]:
        vals = [table.loc[v, ds] for ds in datasets]
        best = max((x for x in vals if not _isnan(x)), default=np.nan)
        rows.append([Cell(v, "code")] + [Cell(fmt_x(x), "num") for x in vals] +
                    [Cell("–" if _isnan(best) else f"{100 * (best - 1):+.0f}%", "num"),
                     Cell(PAPER_CLAIMS[v].text if v in PAPER_CLAIMS else "", "claim")])
    return TableBlock(["variant"] + datasets + ["best over base", "paper (A100, embedding stage)"], rows,
                      caption=f"PREDICTED speedup over base{' on ' + gpu if gpu else ''} (model, not a measurement)")


def _p_e2e(s: RunSource) -> PanelOutput:
    e = s.run.e2e
    gpus = list(dict.fromkeys(e["gpu"].astype(str)))
    mine = s.gpu.get("key")
    gpus.sort(key=lambda g: (g != mine, g))
    datasets = order_datasets(e["dataset"].unique())
    ds = "medium" if "medium" in datasets else datasets[0]
    blocks: list[Any] = []
    for gpu in gpus[:2]:
        for phase, stages in (("inference", INFERENCE_STAGES), ("training", TRAINING_STAGES)):
            d = e[(e["gpu"].astype(str) == gpu) & (e["phase"] == phase) & (e["dataset"] == ds)]
            if d.empty:
                continue
            src = "measured" if (d["source"] == "measured").any() else "predicted"
            d = d[d["source"] == src]
            fig = e2e_stage_figure(d, stages, f"DLRM {phase} step per variant, {ds}, {gpu} ({src})")
            blocks.append(_figure_block(fig, f"{phase.capitalize()} step ({gpu})",
                                        f"time per batch split by stage ({src}; {ds}); a stage includes the idle "
                                        "time before its kernels", stamp=PREDICTION_STAMP if src == "predicted"
                                        else None))
    tot = e[(e["stage"] == "total") & (e["dataset"] == ds)]
    rows = []
    for r in _order(tot).to_dict("records"):
        rows.append([Cell(r["variant"], "code"), Cell(str(r["gpu"])), Cell(r["phase"]), Cell(r["source"]),
                     Cell(fmt_num(r["time_us"]), "num"),
                     Cell(f"{fmt_num(r.get('time_us_low'))}–{fmt_num(r.get('time_us_high'))}", "num"),
                     Cell(fmt_pct(100 * r["embedding_share"]) if not _isnan(r.get("embedding_share")) else "–", "num"),
                     Cell(fmt_x(r.get("speedup_e2e")), "num"), Cell(fmt_x(r.get("speedup_embedding")), "num")])
    blocks.append(TableBlock(["variant", "GPU", "phase", "source", "batch (µs)", "band (µs)", "embedding share",
                              "speedup end to end", "speedup embedding only"], rows,
                             caption=f"{ds}; the paper (A100): up to {PAPER_CLAIMS['end_to_end'].ratio:.2f}x end to "
                                     f"end, {PAPER_CLAIMS['combined'].ratio:.2f}x for the embedding stage"))
    errors = stage_gmae(e)
    if not errors.empty:
        blocks.append(_table(errors, [("phase", _col("phase", _txt, "")), ("stage", _col("stage", _txt, "")),
                                      ("points", _col("points")), ("GMAE", _col("gmae", lambda x: fmt_pct(100 * x)))],
                             caption="the model against the measured step, per stage (geometric-mean absolute error)"))
    return PanelOutput(blocks)


def _p_predictions(s: RunSource) -> PanelOutput:
    p = s.primary_predictions.copy()
    lacking = sorted({"variant", "dataset"} - set(p.columns))
    if lacking:
        raise Missing(f"predictions.csv lacks the column(s) {', '.join(lacking)}")
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements.", "prediction")]
    if "mode" in p.columns:
        p = p[p["mode"].fillna("steady") == "steady"] if (p["mode"] == "steady").any() else p
    gpus = list(dict.fromkeys(p["gpu"].astype(str))) if "gpu" in p.columns else [""]
    mine = s.gpu.get("key")
    gpus.sort(key=lambda g: (g != mine, g))
    for gpu in gpus[:4]:
        d = _order(p[p["gpu"].astype(str) == gpu] if gpu else p)
        if "speedup_vs_base" in d.columns and d["speedup_vs_base"].notna().any():
            fig = prediction_figure(d, gpu, f"Predicted speedup over base{', ' + gpu if gpu else ''}")
            blocks.append(_figure_block(fig,
                                        f"Predicted speedup ({gpu})", f"{PROVENANCE['model'].label} (PREDICTION), "
                                        "steady mode (L2 warm)", stamp=PREDICTION_STAMP))
            blocks.append(_predicted_headline(d, gpu))
    spec = list(POINT_COLS)
    for col, head, f in (("gpu", "GPU", _txt), ("arch", "arch", _txt), ("time_us", "predicted time (µs)", fmt_num),
                         ("time_us_low", "band low (µs)", fmt_num), ("time_us_high", "band high (µs)", fmt_num),
                         ("speedup_vs_base", "predicted vs base", fmt_x),
                         ("l2_hit_rate_pct", "predicted L2 hit", fmt_pct),
                         ("dram_bytes", "predicted DRAM bytes", format_bytes),
                         ("l2_bytes", "predicted L2 bytes", format_bytes),
                         ("bound", "bound by", _txt), ("constants", "constants", _txt), ("note", "note", _txt)):
        if col in p.columns:
            spec.append((head, _col(col, f, "num" if f is not _txt else "")))
    blocks.append(DetailsBlock(f"Prediction table ({len(p)} rows)", [_table(_order(p), spec,
                                                                            caption="PREDICTED by the model; the band "
                                                                            "spans the latency and bandwidth constants "
                                                                            "over their published ranges")]))
    v = s.run.model_validation
    if not v.empty:
        vspec = [(c, _col(c, _txt)) for c in ("claim", "paper", "model", "agrees", "gpu", "constants") if c in v.columns]
        blocks.append(_table(v, vspec, caption="The model against the MICRO 2024 paper's A100 claims (paper "
                                               "configuration on sm_80; model PREDICTIONS vs published measurements)"))
    return PanelOutput(blocks)


def _p_predicted_vs_measured(s: RunSource) -> PanelOutput:
    if s.emulated:
        raise Missing("the timings are CPU emulation; predictions of GPU time are compared with GPU measurements "
                      "only")
    key = s.gpu.get("key")
    p = s.primary_predictions
    if not {"variant", "dataset", "time_us"} <= set(p.columns):
        raise Missing("predictions.csv has no variant/dataset/time_us columns to compare")
    if not key:
        raise Missing("the run records no GPU, so there is no measurement to compare predictions with")
    if "gpu" in p.columns:
        p = p[p["gpu"].astype(str) == key]
    if p.empty:
        raise Missing(f"predictions.csv has no rows for this run's GPU ({key})")
    blocks: list[Any] = []
    for mode in s.modes:
        meas = analyze.speedups(s.bench_ok, mode, against=())
        pm = p[p["mode"] == mode] if "mode" in p.columns else (p if mode == "steady" else p.iloc[0:0])
        m = meas.merge(pm[["variant", "dataset", "time_us"]], on=["variant", "dataset"], how="inner")
        if m.empty:
            continue
        m = _order(m.rename(columns={"latency_us": "measured_us", "time_us": "predicted_us"}))
        m["error_pct"] = 100 * (m["predicted_us"] - m["measured_us"]) / m["measured_us"]
        blocks.append(_figure_block(predicted_vs_measured_figure(m, f"Predicted vs measured time, {mode}"),
                                    f"Predicted vs measured ({mode})",
                                    f"x: {PROVENANCE[s.timing_provenance].label} ({s.timing_mode(mode)}); "
                                    f"y: {PROVENANCE['model'].label} (PREDICTION)", stamp=PREDICTION_STAMP))
        gm = 100 * gmae(m["predicted_us"], m["measured_us"])
        spec = [*POINT_COLS,
                ("measured (µs)", lambda r: Cell(fmt_ci(r["measured_us"], r["latency_ci95_us"]), "num")),
                ("predicted (µs)", _col("predicted_us")), ("error", _col("error_pct", fmt_pct))]
        blocks.append(_table(m, spec, caption=f"{mode}: prediction against measurement",
                             note=f"geometric mean of |relative error| (GMAE, model.gmae): {gm:.1f}%"))
    k = s.lookup
    if not k.empty and "l2_hit_rate_pct" in p.columns and "l2_hit_rate_pct" in k.columns:
        kk = k[k.get("cache_control", pd.Series("", index=k.index)).astype(str) == "none"]
        if not kk.empty:
            meas = kk.groupby(["variant", "dataset"], as_index=False)["l2_hit_rate_pct"].mean()
            pm = p[p["mode"] == "steady"] if "mode" in p.columns else p
            m = meas.merge(pm[["variant", "dataset", "l2_hit_rate_pct"]], on=["variant", "dataset"],
                           suffixes=("_measured", "_predicted"))
            if not m.empty:
                spec = [("variant", lambda r: Cell(str(r["variant"]), "code")),
                        ("dataset", lambda r: Cell(str(r["dataset"]), "code")),
                        ("measured L2 hit (ncu)", _col("l2_hit_rate_pct_measured", fmt_pct)),
                        ("predicted L2 hit (model)", _col("l2_hit_rate_pct_predicted", fmt_pct))]
                gm = 100 * gmae(m["l2_hit_rate_pct_predicted"], m["l2_hit_rate_pct_measured"])
                blocks.append(_table(_order(m), spec, caption="L2 hit rate: Nsight Compute with "
                                     "--cache-control none against the model's PREDICTION",
                                     note=f"geometric mean of |relative error| (GMAE): {gm:.1f}%"))
    if not blocks:
        raise Missing("no (variant, dataset) point has both a prediction and a measurement")
    return PanelOutput(blocks)


# ------------------------------------------------- run: precision and host-resident tables
def _prediction_gpus(s: RunSource, p: pd.DataFrame) -> list[str]:
    """GPUs of the predictions, the run's own first."""
    gpus = list(dict.fromkeys(p["gpu"].astype(str))) if "gpu" in p.columns else [""]
    mine = s.gpu.get("key")
    return sorted(gpus, key=lambda g: (g != mine, gpus.index(g)))


def _p_precision(s: RunSource) -> PanelOutput:
    grid = precision_grid(s.predictions)
    if grid.empty:
        raise Missing("the run predicted one precision only; list more in the experiment (dtypes = [\"fp16\", "
                      "\"bf16\", \"int8\"]) or run `characterize predict EXP --dtypes all`")
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements: each cell is base's predicted time on fp32 "
                                   "tables over the variant's predicted time on that precision (geometric mean over "
                                   "datasets).", "prediction")]
    for gpu in _prediction_gpus(s, grid)[:2]:
        g = grid[grid["gpu"] == gpu]
        blocks.append(_figure_block(precision_grid_figure(g, f"Predicted speedup over fp32 base, {gpu}"),
                                    f"Precision x variant ({gpu})", f"{PROVENANCE['model'].label} (PREDICTION), "
                                    "steady mode", stamp=PREDICTION_STAMP))
    spec = [("GPU", _code("gpu")), ("dtype", _code("dtype")), ("variant", _code("variant")),
            ("predicted speedup over fp32 base", _col("speedup_vs_fp32_base", fmt_x)),
            ("datasets", _col("datasets", fmt_num))]
    blocks.append(DetailsBlock(f"Precision grid ({len(grid)} rows)", [_table(grid, spec, caption="PREDICTED")]))
    return PanelOutput(blocks)


def _host_rows(s: RunSource, variants: tuple[str, ...] = HOST_VARIANTS) -> pd.DataFrame:
    p = s.predictions
    if not {"variant", "cache_ratio", "dataset"} <= set(p.columns):
        raise Missing("the predictions hold no host-resident variant (cache, uvm): name them in the experiment's "
                      "variants, or run `characterize predict EXP --cache-ratio 0.5%,1.5%,5%`")
    h = p[p["variant"].isin(variants) & p["cache_ratio"].notna()]
    if "mode" in h.columns and (h["mode"] == "steady").any():
        h = h[h["mode"] == "steady"]
    if "dtype" in h.columns and len(h):   # the workload's precision (predicted first); extra ones feed the grid
        h = h[h["dtype"] == p["dtype"].iloc[0]] if (h["dtype"] == p["dtype"].iloc[0]).any() else h
    if h.empty:
        raise Missing(f"the predictions hold no {' or '.join(variants)} rows: name "
                      f"{'it' if len(variants) == 1 else 'them'} in the experiment's variants")
    return h


def _host_prov(s: RunSource) -> str:
    return f"{PROVENANCE['model'].label} (PREDICTION) from the trace and the GPU's host link (hardware.HOST_LINKS)"


def _p_cache_ratio(s: RunSource) -> PanelOutput:
    h = _host_rows(s, ("cache",))
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements: the cache's policy replayed on each "
                                   "dataset's trace (warmed from its frequencies).", "prediction")]
    gpu = _prediction_gpus(s, h)[0]
    d = h[h["gpu"].astype(str) == gpu] if gpu else h
    blocks.append(_figure_block(cache_hit_figure(d, f"Predicted cache hit rate vs cache size ({gpu})"),
                                "Cache hit rate vs cache ratio", _host_prov(s), stamp=PREDICTION_STAMP))
    spec = [("dataset", _code("dataset")), ("GPU", _code("gpu")), ("cache (% of E)", _col("cache_ratio", fmt_pct100)),
            ("C (rows)", _col("cache_rows", fmt_num)), ("predicted hit rate (unique rows)",
                                                        _col("cache_hit_rate_pct", fmt_pct)),
            ("predicted hit rate (lookups)", _col("cache_lookup_hit_rate_pct", fmt_pct)),
            ("share of all-GPU speed", _col("speedup_vs_base", fmt_pct100))]
    blocks.append(DetailsBlock(f"Cache sizes ({len(h)} rows)", [_table(
        _order(h), spec, caption=f"PREDICTED for {h['dtype'].iloc[0] if 'dtype' in h.columns else 'the'} tables: "
        "the cache sizes the run swept; share of all-GPU speed = base's time (tables in GPU memory) / this time")]))
    return PanelOutput(blocks)


def fmt_pct100(v: Any) -> str:
    """A share (0..1) as a percentage."""
    return fmt_pct(100 * v) if not _isnan(v) else "–"


def _p_host_time(s: RunSource) -> PanelOutput:
    h = _host_rows(s)
    gpu = _prediction_gpus(s, h)[0]
    d = _order(h[h["gpu"].astype(str) == gpu] if gpu else h)
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements: the parts run one after another "
                                   "(dedup/map: unique ids and the slot map on the GPU; transfer: the missed rows "
                                   "gathered on the host and copied in one batch, or managed pages migrated; "
                                   "lookup: base's kernel on the cache slots).", "prediction")]
    blocks.append(_figure_block(host_time_figure(d, f"Predicted time per table launch, split ({gpu})"),
                                "Time breakdown per batch", _host_prov(s), stamp=PREDICTION_STAMP))
    spec = [*POINT_COLS, ("cache (% of E)", _col("cache_ratio", fmt_pct100)),
            ("dedup/map (µs)", _col("dedup_us")), ("transfer (µs)", _col("transfer_us")),
            ("lookup (µs)", _col("lookup_us")), ("total (µs)", _col("time_us"))]
    blocks.append(DetailsBlock(f"Time split ({len(d)} rows)", [_table(d, spec, caption="PREDICTED, per table "
                                                                      "launch; a batch is T of them")]))
    return PanelOutput(blocks)


def _p_host_bytes(s: RunSource) -> PanelOutput:
    h = _host_rows(s)
    gpu = _prediction_gpus(s, h)[0]
    d = h[h["gpu"].astype(str) == gpu] if gpu else h
    cache = d[d["variant"] == "cache"]
    link = HOST_LINKS.get(str(d["host_link"].iloc[0])) if "host_link" in d.columns else None
    if cache.empty or link is None:
        raise Missing("no cache rows with a known host link to set against its bandwidth")
    budget = {ds: link.GBps * 1e3 * float(g["lookup_us"].iloc[0]) for ds, g in cache.groupby("dataset")}
    blocks: list[Any] = [NoteBlock(f"Model predictions, not measurements. {link.name}: {link.GBps:g} GB/s "
                                   f"({link.source.split(';')[0]}).", "prediction")]
    blocks.append(_figure_block(host_bytes_figure(cache, budget, f"Predicted host bytes vs {link.name} ({gpu})"),
                                "Host bytes against link bandwidth", _host_prov(s), stamp=PREDICTION_STAMP))
    spec = [*POINT_COLS, ("cache (% of E)", _col("cache_ratio", fmt_pct100)),
            ("host bytes per launch", _col("host_bytes", format_bytes)), ("link", _code("host_link")),
            ("transfer (µs)", _col("transfer_us"))]
    blocks.append(DetailsBlock(f"Host traffic ({len(d)} rows)", [_table(_order(d), spec, caption="PREDICTED; uvm "
                                                                        "migrates whole 64 KiB pages")]))
    return PanelOutput(blocks)


def _p_failures(s: RunSource) -> PanelOutput:
    f = s.failures  # failed points and unreadable reports (store.Run.failures)
    if f.empty:
        return PanelOutput([NoteBlock("No failed points.")])
    spec = [("kind", lambda r: Cell(str(r["kind"]), "")), ("variant", lambda r: Cell(str(r["variant"]), "code")),
            ("dataset", lambda r: Cell(str(r["dataset"]), "code")), ("error", lambda r: Cell(_txt(r["error"]), "msg"))]
    return PanelOutput([_table(_order(f), spec, caption=f"{len(f)} point(s) failed; the other points are unaffected")])


def _headline_prov(s: RunSource) -> tuple[str, ...]:
    return (s.timing_provenance,) if not s.bench_ok.empty else ("model",)


RUN_PANELS: tuple[Panel, ...] = (
    Panel("environment", "Environment", S_OVERVIEW, ("meta",), ("meta",),
          "GPU, driver, clocks, collection modes, versions and command line as recorded in meta.json and the "
          "point files", _p_environment),
    Panel("contents", "What this run holds", S_OVERVIEW, (), ("meta",),
          "which stages left results in the run directory, and why the others did not", _p_contents),
    Panel("headline", "Headline: technique × hotness → speedup over base", S_OVERVIEW, (), _headline_prov,
          "analyze.headline(): ratio of the mean per-table latency of base to that of each variant, per dataset, "
          "set beside the MICRO 2024 paper's A100 claims (analysis.claims.PAPER_CLAIMS); with nothing measured, "
          "the model's predicted ratios with their bands, labelled as predictions", _p_headline),
    Panel("locality", "Trace locality per dataset", S_LOCALITY, ("locality",), ("trace",),
          "unique rows, top-K coverage and reuse distances of one table's index stream per dataset "
          "(locality.json, exact reuse distances)", _p_locality),
    Panel("static", "Registers, spills and theoretical occupancy", S_STATIC, ("static",), ("static",),
          "each variant compiled with nvcc per architecture as configured; ptxas -v resources into the occupancy "
          "calculator (static.csv rows with sweep = False)", _p_static),
    Panel("sweep", "Register sweep", S_STATIC, ("sweep",), ("static",),
          "the lookup kernels recompiled with each -maxrregcount of the experiment (static.csv rows with "
          "sweep = True)", _p_sweep),
    Panel("sass", "SASS hot loop: rows in flight, load widths, spills", S_STATIC, ("sass",), _sass_prov,
          "the hot loop of each lookup kernel read from its SASS (sass.csv: loads by width, spills, memory "
          "latencies serialized per iteration, rows in flight), beside the model's loads_in_flight "
          "(predictions.csv) and the measured long-scoreboard stall (ncu)", _p_sass),
    Panel("latency", "Latency per variant and dataset", S_TIMING, ("bench",), _timing_prov,
          "mean per-table latency with its 95% CI, per timing mode (analyze.speedups)", _p_latency),
    Panel("speedup", "Speedup over base and over torch", S_TIMING, ("bench",), _timing_prov,
          "ratio of means with a 95% CI by the delta method (analyze.speedups)", _p_speedup),
    Panel("bandwidth", "Effective bandwidth against the GPU's peak", S_TIMING, ("bench",), _timing_prov,
          "bytes a table launch must move / mean latency, against the HBM peak of the run's GPU "
          "(meta.json gpu.hbm_GBps)", _p_bandwidth),
    Panel("prepass", "L2 pre-pass included and excluded", S_TIMING, ("bench",), _timing_prov,
          "lookup-kernel time and the time of the L2 pre-pass before it, timed separately with events; speedups "
          "with the pre-pass excluded (as the paper counts) and included", _p_prepass),
    Panel("sol", "Speed of light", S_SOL, ("profile", "sol"), ("ncu",),
          "sm__throughput, gpu__compute_memory_throughput, l1tex/lts/dram throughput as % of peak sustained of "
          "the lookup kernels, mean launch per point; the bound after ncu's SOLBottleneck rule", _p_sol),
    Panel("roofline", "Roofline", S_SOL, ("profile", "roofline"), ("ncu",),
          "ncu's roofline counters of the lookup kernels as achieved and peak FLOP/s and bytes/s", _p_roofline),
    Panel("memory", "Memory chart, hit rates and DRAM traffic", S_MEM, ("profile",), ("ncu",),
          "L1 requests and sectors, L2 reads and writes, sector hit rates (clamped at 100%, 'no traffic' apart), "
          "DRAM bytes read and written of the lookup kernels, mean launch per point", _p_memory),
    Panel("stalls", "Warp-stall breakdown", S_STALLS, ("profile",), ("ncu",),
          "WarpStateStats stall reasons in cycles per issued instruction, reasons ranked by stall cycles weighted "
          "by instructions issued (analysis.ncu.weighted_stalls)", _p_stalls),
    Panel("occupancy", "Achieved vs theoretical occupancy", S_STALLS, ("profile",), ("ncu",),
          "sm__warps_active (achieved) and sm__maximum_warps_per_active_cycle_pct (theoretical) of the profiled "
          "lookup kernels, averaged per point", _p_occupancy),
    Panel("kernels", "Every profiled kernel", S_NCU, ("profile",), ("ncu",),
          "one row per kernel in the run's reports (analysis.ncu.kernel_summary)", _p_kernels),
    Panel("rules", "Nsight Compute rule findings, ranked", S_RULES, ("profile",), ("ncu",),
          "ncu's own guided-analysis rules stored in each point's report (extract.rule_results) as a finding x "
          "point matrix", _p_rules),
    Panel("predictions", "Model predictions", S_MODEL, ("predictions",), ("model",),
          "predictions.csv written by the model step; predictions, not measurements", _p_predictions),
    Panel("e2e", "The whole DLRM step", S_MODEL, ("e2e",), ("model",),
          "e2e.csv: the DLRM step (bottom MLP, embedding stage, interaction, top MLP; training adds backward and "
          "optimizer) per variant, predicted per stage by analysis.model.e2e (measured on a GPU)", _p_e2e),
    Panel("predicted-vs-measured", "Predicted vs measured", S_MODEL, ("predictions", "bench"),
          lambda s: ("model", s.timing_provenance),
          "predictions for the run's GPU joined with the measured points (and ncu L2 hit rates collected with "
          "--cache-control none)", _p_predicted_vs_measured),
    Panel("precision", "Precision x variant: predicted speedup over fp32 base", S_MODEL, ("predictions",), ("model",),
          "predictions.csv rows of every precision the experiment lists (dtypes), base at fp32 as the reference "
          "(analysis.model.predict.precision_grid)", _p_precision),
    Panel("cache-ratio", "Host-resident tables: cache hit rate vs cache size", S_MODEL, ("predictions",), ("model",),
          "predictions.csv rows of the cache variant at each cache size the run swept (analysis.model.host: the "
          "cache's policy replayed on the trace)", _p_cache_ratio),
    Panel("host-time", "Host-resident tables: time per batch, split", S_MODEL, ("predictions",), ("model",),
          "predictions.csv dedup_us, transfer_us and lookup_us of the cache and uvm rows (analysis.model.host)",
          _p_host_time),
    Panel("host-bytes", "Host-resident tables: host bytes against the link", S_MODEL, ("predictions",), ("model",),
          "predictions.csv host_bytes of the cache rows against the host link's bandwidth (hardware.HOST_LINKS) "
          "times the lookup kernel's predicted time", _p_host_bytes),
    Panel("failures", "Failed points", S_FAIL, (), ("meta",),
          "points whose bench or profile step failed, with the recorded error (Run.failures)", _p_failures),
)
