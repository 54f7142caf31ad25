"""Report stage, panels of a stored run's overview: its environment, what it holds, the headline
and the failed points.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from characterize.analysis import compare as analyze
from characterize.analysis.answer import predicted_speedups
from characterize.analysis.claims import PAPER_CLAIMS
from characterize.report.blocks import (
    PREDICTION_STAMP,
    Cell,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    TableBlock,
    as_text,
    figure_block,
    fmt_num,
    fmt_x,
    is_na,
    kv_table,
    ordered_rows,
    table_block,
)
from characterize.report.layout import (
    BENCH_HINT,
    NEEDS,
    PROFILE_HINT,
    S_FAIL,
    S_OVERVIEW,
    Panel,
    is_paper,
    never_measured,
    points_missing,
)
from characterize.report.plots import (
    order_datasets,
    prediction_figure,
    speedup_figure,
)
from characterize.report.provenance import PROVENANCE, TIMING_MODES, ncu_mode_text
from characterize.report.sources import RunSource
from characterize.report.views import prediction_gpus


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
             ("command line", m.get("command_line")), ("git revision", env.get("git_revision") or
              ("none (the source was not a git checkout)" if "git_revision" in env else None)),
             ("started", m.get("started")), ("resumed", ", ".join(map(str, m.get("resumed", []))))]
    an = m.get("analyzed") or {}
    if an:
        same = an.get("same_kernels")
        rows.append(("analyzed without the GPU", f"{an.get('at', '?')}, revision {an.get('git_revision') or '?'}, "
                     f"kernel sources {an.get('kernels', '?')}" + (
                         "" if same is None else "; the same kernels as measured" if same else
                         f"; NOT the kernels measured ({an.get('measured_kernels')}): the static facts and "
                         "predictions describe today's kernels, the measurements the ones that ran")))
    steps = m.get("steps") or {}
    if steps:
        rows.append(("steps", "; ".join(f"{k}: {v}" for k, v in steps.items())))
    # what identifies the measurement in one line; the whole record a click away
    told = dict(rows)
    head = "; ".join(f"{k} {v}" for k, v in told.items()
                     if k in ("GPU", "driver", "timing clocks") and v not in (None, ""))
    warn = [NoteBlock("Analyzed with other kernel sources than were measured: " +
                      str(told["analyzed without the GPU"]).split("; NOT ", 1)[1], "warning")] \
        if "; NOT " in str(told.get("analyzed without the GPU", "")) else []
    return PanelOutput([NoteBlock(head or "no GPU recorded"), *warn,
                        DetailsBlock(f"The full record ({sum(v not in (None, '') for v in told.values())} entries)",
                                     [kv_table(rows)])])


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
         points_missing(s, "bench", BENCH_HINT), PROVENANCE[s.timing_provenance].label if bp else ""],
        ["Nsight Compute profile", status(p_ok > 0 and not s.metrics.empty),
         f"{p_ok} point(s) profiled, {len(pp) - p_ok} failed" +
         (f", {len(s.unreadable_reports)} report(s) unreadable (see Failures)" if s.unreadable_reports else "")
         if pp else points_missing(s, "profile", PROFILE_HINT),
         PROVENANCE["ncu"].label if pp else ""],
        ["model predictions", status(not s.predictions.empty),
         f"{len(s.predictions)} prediction row(s)" if not s.predictions.empty else NEEDS["predictions"].why_missing(s),
         PROVENANCE["model"].label if not s.predictions.empty else ""],
    ]
    return PanelOutput([TableBlock(["data", "status", "details", "provenance"],
                                   [[c if isinstance(c, Cell) else Cell(str(c)) for c in r] for r in rows])])


def _speedup_ci_table(s: RunSource, mode: str) -> pd.DataFrame:
    return analyze.speedups(s.bench_ok, mode, against=("base",))


def _paper_claims(s: RunSource) -> dict[str, str]:
    """The paper's claims to set beside a run's speedups: only for the paper's configuration."""
    return {k: c.text for k, c in PAPER_CLAIMS.items()} if is_paper(s) else {}


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
    claims = _paper_claims(s)
    for mode in s.modes:
        table = analyze.headline(s.bench_ok, mode)
        if table.empty:
            continue
        ci = _speedup_ci_table(s, mode).set_index(["variant", "dataset"])
        if mode == s.modes[0]:
            sp = ordered_rows(analyze.speedups(s.bench_ok, mode, against=("base",)))
            blocks.append(figure_block(speedup_figure(sp, "base", f"Speedup over base, {mode}"),
                                       f"Speedup over base ({mode})", f"{PROVENANCE[s.timing_provenance].label}; "
                                       f"{s.timing_mode(mode)}; error bars: 95% CI (delta method)",
                                       stamp=s.timing_stamp))
        datasets = list(table.columns)
        rows = []
        for v in ordered_rows(pd.DataFrame({"variant": table.index}))["variant"]:
            cells = [Cell(v, "code")]
            vals = []
            for d in datasets:
                x = table.loc[v, d]
                c = ci["speedup_vs_base_ci95"].get((v, d), np.nan) if (v, d) in ci.index else np.nan
                vals.append(x)
                cells.append(Cell(fmt_x(x, c), "num" + (" good" if not is_na(x) and x > 1.02 else
                                                        " bad" if not is_na(x) and x < 0.98 else "")))
            best = np.nanmax(vals) if any(not is_na(x) for x in vals) else np.nan
            cells.append(Cell("–" if is_na(best) else f"{100 * (best - 1):+.0f}%", "num"))
            if claims:
                cells.append(Cell(claims.get(v, ""), "claim"))
            rows.append(cells)
        blocks.append(TableBlock(["variant"] + datasets + ["best over base"] +
                                 (["paper (A100, embedding stage)"] if claims else []), rows,
                                 caption=f"Speedup over base, {TIMING_MODES.get(mode, mode)} "
                                         f"({PROVENANCE[s.timing_provenance].label})",
                                 note="ratio of mean per-table latencies (> 1: faster than base) with a 95% CI"))
    slow = analyze.slowdown_random_vs_one_item(s.bench_ok)
    if not is_na(slow):
        blocks.append(NoteBlock(f"base: random access is {slow:.2f}x slower than one-item (steady mode)" +
                                (f"; paper: {claims['random_vs_one_item']}." if claims else ".")))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


def _predicted_headline_panel(s: RunSource) -> PanelOutput:
    """With nothing measured, the headline shows the model's predictions with their bands:
    a chart per GPU (the band as error bars), the numbers on demand."""
    p = s.primary_predictions
    if p.empty or not {"variant", "dataset", "time_us"} <= set(p.columns):
        raise Missing(points_missing(s, "bench", BENCH_HINT) + " No model predictions either (predictions.csv).")
    if "mode" in p.columns and (p["mode"] == "steady").any():
        p = p[p["mode"] == "steady"]
    sp = predicted_speedups(p)
    banded = sp["speedup_low"].notna().any()
    why = points_missing(s, "bench", BENCH_HINT)
    if never_measured(s, "bench"):   # the "needs a GPU" box says how to measure
        why = why.split(". ")[0] + "."
    blocks: list[Any] = [NoteBlock(
        "Nothing was measured in this run: these are the MODEL'S PREDICTIONS, not measurements"
        + (" (error bars and brackets: the band the model's constants allow)" if banded else
           " (this predictions.csv carries no band: time_us_low/time_us_high)") + ". " + why[:1].upper() + why[1:],
        "prediction")]
    claims = _paper_claims(s)
    gpus = prediction_gpus(s, sp)
    for i, gpu in enumerate(gpus[:3]):
        d = sp[sp["gpu"].astype(str) == gpu] if gpu else sp
        if i < 2:
            blocks.append(figure_block(prediction_figure(ordered_rows(d), gpu, f"Predicted speedup over base"
                                                                               f"{', ' + gpu if gpu else ''}"),
                                       f"Predicted speedup ({gpu})", f"{PROVENANCE['model'].label} (PREDICTION), "
                                       "steady mode; error bars: the model's band", stamp=PREDICTION_STAMP))
        datasets = order_datasets(d["dataset"])
        rows = []
        for v in ordered_rows(pd.DataFrame({"variant": d["variant"].unique()}))["variant"]:
            cells, vals = [Cell(v, "code")], []
            for ds in datasets:
                r = d[(d["variant"] == v) & (d["dataset"] == ds)]
                if r.empty:
                    cells.append(Cell("–", "num"))
                    continue
                x, lo, hi = r["speedup"].iloc[0], r["speedup_low"].iloc[0], r["speedup_high"].iloc[0]
                vals.append(x)
                band = "" if is_na(lo) else f" [{lo:.2f}–{hi:.2f}]"
                cells.append(Cell(f"{x:.2f}×{band}" if not is_na(x) else "–", "num"))
            best = max((x for x in vals if not is_na(x)), default=np.nan)
            cells.append(Cell("–" if is_na(best) else f"{100 * (best - 1):+.0f}%", "num"))
            if claims:
                cells.append(Cell(claims.get(v, ""), "claim"))
            rows.append(cells)
        blocks.append(DetailsBlock(f"The numbers{' for ' + gpu if gpu else ''} ({len(rows)} variants)", [TableBlock(
            ["variant"] + datasets + ["best over base (predicted)"] +
            (["paper (A100, embedding stage)"] if claims else []), rows,
            caption=f"PREDICTED speedup over base{' on ' + gpu if gpu else ''}, steady mode "
                    "(model prediction, not a measurement)")]))
    return PanelOutput(blocks, provenance=("model",), modes="model: steady mode (L2 warm between batches)")


def _headline_prov(s: RunSource) -> tuple[str, ...]:
    return (s.timing_provenance,) if not s.bench_ok.empty else ("model",)


def _p_failures(s: RunSource) -> PanelOutput:
    f = s.failures  # failed points and unreadable reports (store.Run.failures)
    if f.empty:
        return PanelOutput([NoteBlock("No failed points.")])
    spec = [("kind", lambda r: Cell(str(r["kind"]), "")), ("variant", lambda r: Cell(str(r["variant"]), "code")),
            ("dataset", lambda r: Cell(str(r["dataset"]), "code")),
            ("error", lambda r: Cell(as_text(r["error"]), "msg"))]
    return PanelOutput([table_block(ordered_rows(f), spec,
                                    caption=f"{len(f)} point(s) failed; the other points are unaffected")])


PANELS: tuple[Panel, ...] = (
    Panel("headline", "Headline: technique × hotness → speedup over base", S_OVERVIEW, (), _headline_prov,
          "analyze.headline(): ratio of the mean per-table latency of base to that of each variant, per dataset "
          "(for the paper's configuration, beside the MICRO 2024 paper's A100 claims, analysis.claims); with "
          "nothing measured, the model's predicted ratios with their bands, labelled as predictions", _p_headline),
    Panel("contents", "What this run holds", S_OVERVIEW, (), ("meta",),
          "which stages left results in the run directory, and why the others did not", _p_contents),
    Panel("environment", "Environment", S_OVERVIEW, ("meta",), ("meta",),
          "GPU, driver, clocks, collection modes, versions and command line as recorded in meta.json and the "
          "point files", _p_environment),
)


FAILURE_PANELS: tuple[Panel, ...] = (
    Panel("failures", "Failed points", S_FAIL, (), ("meta",),
          "points whose bench or profile step failed, with the recorded error (Run.failures)", _p_failures),
)
