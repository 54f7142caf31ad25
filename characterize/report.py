"""Report stage: stored runs and Nsight Compute reports -> one self-contained HTML file.

    render_report(["runs/paper-a100-80gb"], "reports/paper-a100.html")      # one run
    render_report([run_a, run_b], "compare.html")                           # two runs: + comparison
    render_report(["any_app.ncu-rep"], "app.html")                         # generic per-kernel report

Sources are run directories (or :class:`~characterize.store.Run` objects) and
``.ncu-rep`` / ncu CSV files. The page is rendered with jinja2 (autoescaping on: every
kernel, variant and dataset name is text, never markup) from ``templates/``; its CSS is
inlined and its figures are PNGs from :mod:`characterize.plots` embedded as data URIs,
so the file opens offline and fetches nothing (a Content-Security-Policy forbids it).

The page is assembled from panels declared as data (:data:`RUN_PANELS`,
:data:`IMPORT_PANELS`, :data:`COMPARE_PANELS`): each :class:`Panel` names the data it
needs (:data:`NEEDS`), how its numbers were obtained and their provenance
(:data:`PROVENANCE`: Nsight Compute, CUDA events, CPU emulation, static analysis,
trace analysis, model prediction), and a builder. A panel whose data is absent is
still shown, saying why (no GPU, step not run, points failed), so partial runs
render. Every figure caption names the cache-control / clock-control mode (ncu) or
timing mode (steady/cold L2) its numbers come from.
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from . import analyze
from .errors import CharacterizeError, ReportError
from .model import gmae
from .store import Run, load_run, write_atomic

__all__ = [
    "render_report", "report_html", "build_report", "Panel", "Need", "Provenance", "PROVENANCE", "NEEDS",
    "RUN_PANELS", "IMPORT_PANELS", "COMPARE_PANELS", "Missing",
]

TEMPLATES = Path(__file__).parent / "templates"
REPORT_SUFFIXES = (".ncu-rep", ".ncu-repz", ".csv")


# ================================================================= provenance
@dataclass(frozen=True)
class Provenance:
    """Where a number comes from: a short badge and one sentence on how it was obtained."""

    key: str
    label: str
    how: str
    css: str


PROVENANCE: dict[str, Provenance] = {p.key: p for p in (
    Provenance("ncu", "Nsight Compute", "hardware performance counters read by Nsight Compute (ncu) while the "
               "kernel ran under the profiler (kernel replay: later passes can see a warmer L2)", "ncu"),
    Provenance("cuda-events", "CUDA events (GPU)", "GPU time between CUDA events around each table's kernel "
               "launch, at the GPU's normal clocks (not locked), mean over repetitions after warm-up batches, "
               "95% confidence interval from the t distribution", "gpu"),
    Provenance("cpu-emulation", "CPU emulation: NOT GPU performance", "the kernel source compiled for the host "
               "and run serially on the CPU; these timings only check the harness and say nothing about "
               "GPU performance", "emu"),
    Provenance("static", "static analysis", "ptxas resource usage (registers, spills, stack) of each kernel "
               "compiled with nvcc, fed to the occupancy calculator; no GPU involved", "static"),
    Provenance("trace", "trace analysis", "statistics of the index stream of one table of each dataset, "
               "computed on the CPU from the trace", "trace"),
    Provenance("model", "model prediction", "predicted by characterize.model from trace locality, the static "
               "characterization and the GPU's specifications: a prediction, not a measurement", "model"),
    Provenance("meta", "run metadata", "recorded in the run directory (meta.json, point files) when the run "
               "was made", "meta"),
)}

TIMING_MODES = {
    "steady": "steady mode: L2 warm (batches repeated, tables launched back to back)",
    "cold": "cold mode: L2 flushed before every table launch",
}
_CACHE_CONTROL = {
    "none": "--cache-control none (caches kept between kernels, so L2 pinning is visible)",
    "all": "--cache-control all (caches flushed before each profiled kernel: L2 pinning erased)",
}
_CLOCK_CONTROL = {
    "base": "--clock-control base (clocks locked to base: comparable, slower than normal clocks)",
    "none": "--clock-control none (clocks not locked)",
}


def ncu_mode_text(cache: Any, clock: Any, replay: Any = None) -> str:
    """One line naming the ncu collection modes of a number."""
    def known(v: Any) -> str | None:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) or v == "" else str(v)

    c, k, r = known(cache), known(clock), known(replay)
    parts = [_CACHE_CONTROL.get(c, f"--cache-control {c}") if c else "cache-control not recorded",
             _CLOCK_CONTROL.get(k, f"--clock-control {k}") if k else "clock-control not recorded"]
    if r:
        parts.append(f"--replay-mode {r}")
    return "ncu " + ", ".join(parts)


# ============================================================== page elements
@dataclass
class Cell:
    text: str
    cls: str = ""
    title: str = ""
    detail: str = ""  # longer text shown on demand (a collapsed <details> in the cell)


KERNEL_NAME_INLINE = 120  # longer demangled names show the function name, the full name on demand


def kernel_cell(name: Any, function: Any = "") -> Cell:
    """A kernel's demangled name as a cell: in full when short, else its function name
    with the full name behind a disclosure."""
    full = _txt(name) or _txt(function)
    if len(full) <= KERNEL_NAME_INLINE:
        return Cell(full, "kname")
    from .extract import short_function_name

    return Cell(_txt(function) or short_function_name(full), "kname", detail=full)


@dataclass
class TableBlock:
    columns: list[str]
    rows: list[list[Cell]]
    caption: str = ""
    note: str = ""
    kind: str = "table"


@dataclass
class FigureBlock:
    title: str
    data_uri: str
    width: int
    height: int
    alt: str
    caption: str
    kind: str = "figure"


@dataclass
class NoteBlock:
    text: str
    level: str = "info"  # info | warning | prediction
    kind: str = "note"


@dataclass
class DetailsBlock:
    summary: str
    blocks: list[Any]
    open: bool = False
    kind: str = "details"


@dataclass
class PanelOutput:
    """What a builder returns: blocks, and optionally a provenance and mode that refine the panel's."""

    blocks: list[Any]
    provenance: tuple[str, ...] | None = None
    modes: str = ""


EMULATION_STAMP = "CPU EMULATION: NOT GPU PERFORMANCE"
PREDICTION_STAMP = "MODEL PREDICTION"


class Missing(Exception):
    """Raised by a builder when its data is absent; the message says why, for the reader."""


def _figure_block(fig: Any, title: str, caption: str, alt: str | None = None, stamp: str | None = None
                  ) -> FigureBlock:
    from .plots import png
    from .plots import stamp as put_stamp

    if stamp:
        put_stamp(fig, stamp, "#a0521e" if stamp == PREDICTION_STAMP else "#b3261e")
    data = png(fig)
    w, h = (int(round(v)) for v in fig.get_size_inches() * fig.dpi)
    fig.clear()
    return FigureBlock(title, "data:image/png;base64," + base64.b64encode(data).decode("ascii"), w, h,
                       alt or title, caption)


# ------------------------------------------------------------------ formatting
def _isnan(x: Any) -> bool:
    try:
        return x is None or x is pd.NA or (isinstance(x, (float, np.floating)) and math.isnan(x))
    except TypeError:
        return False


def fmt_num(x: Any, digits: int = 3) -> str:
    """A number for a table: thousands separators, about `digits` significant figures."""
    if _isnan(x):
        return "–"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    a = abs(v)
    if a >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    if a >= 1:
        return f"{v:,.{max(0, digits - 1 - int(math.floor(math.log10(a))))}f}"
    if a == 0:
        return "0"
    return f"{v:.{digits}g}"


def fmt_pct(x: Any, digits: int = 1) -> str:
    return "–" if _isnan(x) else f"{float(x):.{digits}f}%"


def fmt_x(x: Any, ci: Any = None) -> str:
    if _isnan(x):
        return "–"
    return f"{float(x):.2f}×" + ("" if _isnan(ci) else f" ±{float(ci):.2f}")


def fmt_ci(x: Any, ci: Any) -> str:
    return fmt_num(x) + ("" if _isnan(ci) else f" ± {fmt_num(ci, 2)}")


def fmt_bytes(x: Any) -> str:
    if _isnan(x):
        return "–"
    v = float(x)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:,.2f} {unit}"
    return f"{v:,.0f} B"


def _txt(x: Any) -> str:
    return "" if _isnan(x) else str(x)


def _table(df: pd.DataFrame | Sequence[dict], spec: Sequence[tuple[str, Callable[[dict], Any]]],
           caption: str = "", note: str = "") -> TableBlock:
    """TableBlock from records; each spec item is (header, row -> str | Cell)."""
    records = df.to_dict("records") if isinstance(df, pd.DataFrame) else list(df)
    rows = []
    for r in records:
        cells = []
        for _, fn in spec:
            v = fn(r)
            cells.append(v if isinstance(v, Cell) else Cell(str(v)))
        rows.append(cells)
    return TableBlock([h for h, _ in spec], rows, caption, note)


def _col(name: str, f: Callable[[Any], str] = fmt_num, cls: str = "num") -> Callable[[dict], Cell]:
    return lambda r: Cell(f(r.get(name)), cls)


def _code(name: str) -> Callable[[dict], Cell]:
    return lambda r: Cell(_txt(r.get(name)), "code")


#: the (variant, dataset) columns that start most tables
POINT_COLS: tuple[tuple[str, Callable[[dict], Cell]], ...] = (
    ("variant", _code("variant")), ("dataset", _code("dataset")))


def _kv(rows: Sequence[tuple[str, Any]], caption: str = "") -> TableBlock:
    return TableBlock(["", ""], [[Cell(k, "key"), Cell(_txt(v), "code" if k in _CODE_KEYS else "")]
                                for k, v in rows if not _isnan(v) and v != ""], caption, kind="kv")


_CODE_KEYS = {"command line", "directory", "git revision", "compiler"}


def _order(df: pd.DataFrame, variant: str = "variant", dataset: str = "dataset") -> pd.DataFrame:
    """Rows in family order of variants, then hotness order of datasets."""
    from .plots import order_datasets, order_variants

    if df.empty:
        return df
    d = df.copy()
    if variant in d.columns:
        vo = {v: i for i, v in enumerate(order_variants(d[variant].astype(str)))}
        d["_vo"] = d[variant].astype(str).map(vo)
    else:
        d["_vo"] = 0
    if dataset in d.columns:
        do = {v: i for i, v in enumerate(order_datasets(d[dataset].astype(str)))}
        d["_do"] = d[dataset].astype(str).map(do)
    else:
        d["_do"] = 0
    return d.sort_values(["_vo", "_do"], kind="stable").drop(columns=["_vo", "_do"]).reset_index(drop=True)


_MARKUP = re.compile(r"@(section|url|source|[a-z]+):([^@]*)@")


def clean_rule_text(text: str) -> str:
    """ncu rule messages carry '@section:Id:Name@' / '@url:Text:URL@' markup: plain text instead."""
    def repl(m: re.Match) -> str:
        kind, body = m.group(1), m.group(2)
        if kind == "url":
            label, _, url = body.partition(":")
            return f"{label} ({url})" if url else label
        return body.rsplit(":", 1)[-1] if kind != "section" else body.split(":", 1)[-1]
    return _MARKUP.sub(repl, text or "")


# ==================================================================== sources
class RunSource:
    """A stored run, with the frames panels need computed once (and errors kept as reasons)."""

    kind = "run"

    def __init__(self, run: Run, index: int):
        self.run = run
        self.index = index
        self.slug = f"s{index}"
        self.label = run.name
        self.errors: dict[str, str] = {}

    # ------------------------------------------------------------- raw data
    @property
    def meta(self) -> dict:
        return self.run.meta or {}

    @cached_property
    def bench_points(self) -> list[dict]:
        return self.run.points("bench")

    @cached_property
    def profile_points(self) -> list[dict]:
        return self.run.points("profile")

    @cached_property
    def bench(self) -> pd.DataFrame:
        return self.run.bench

    @cached_property
    def bench_ok(self) -> pd.DataFrame:
        b = self.bench
        if b.empty or "status" not in b.columns:
            return pd.DataFrame()
        return b[b["status"] == "ok"].reset_index(drop=True)

    @cached_property
    def modes(self) -> list[str]:
        if self.bench_ok.empty or "mode" not in self.bench_ok.columns:
            return []
        present = list(dict.fromkeys(self.bench_ok["mode"].astype(str)))
        return [m for m in ("steady", "cold") if m in present] + [m for m in present if m not in ("steady", "cold")]

    @property
    def unreadable_reports(self) -> list[dict]:
        """Profiled points whose report could not be read (filled while reading metrics)."""
        return self.run.unreadable_reports

    @cached_property
    def metrics(self) -> pd.DataFrame:
        m = self.run.metrics
        if m.empty and self.unreadable_reports:
            self.errors["profile"] = "; ".join(f"{u['variant']} {u['dataset']}: {u['error']}"
                                               for u in self.unreadable_reports)
        return m

    @cached_property
    def kernels(self) -> pd.DataFrame:
        return self.run.kernels

    @cached_property
    def lookup(self) -> pd.DataFrame:
        return analyze.lookup_kernels(self.kernels) if not self.kernels.empty else pd.DataFrame()

    @cached_property
    def static(self) -> pd.DataFrame:
        try:
            s = self.run.static
        except CharacterizeError as e:
            self.errors["static"] = str(e)
            return pd.DataFrame()
        if not s.empty and "sweep" in s.columns:
            s = s.copy()
            s["sweep"] = s["sweep"].astype(str).str.lower().isin(["true", "1", "1.0"])
        return s

    @cached_property
    def static_config(self) -> pd.DataFrame:
        s = self.static
        return s[~s["sweep"]].reset_index(drop=True) if not s.empty and "sweep" in s.columns else s

    @cached_property
    def static_sweep(self) -> pd.DataFrame:
        s = self.static
        if s.empty or "sweep" not in s.columns:
            return pd.DataFrame()
        d = s[s["sweep"]]
        if "role" in d.columns:
            d = d[d["role"] == "lookup"]
        return d.reset_index(drop=True)

    @cached_property
    def predictions(self) -> pd.DataFrame:
        try:
            return self.run.predictions
        except CharacterizeError as e:
            self.errors["predictions"] = str(e)
            return pd.DataFrame()

    @cached_property
    def failures(self) -> pd.DataFrame:
        return self.run.failures

    # ---------------------------------------------------------- provenance
    @cached_property
    def emulated(self) -> bool:
        """True when the timings come from the CPU-emulation backend."""
        if self.meta.get("backend") == "emulate":
            return True
        return any(p.get("backend") == "emulate" for p in self.bench_points)

    @property
    def timing_provenance(self) -> str:
        return "cpu-emulation" if self.emulated else "cuda-events"

    @property
    def timing_stamp(self) -> str | None:
        return EMULATION_STAMP if self.emulated else None

    def timing_mode(self, mode: str) -> str:
        clocks = "CPU emulation: no GPU caches or clocks involved" if self.emulated else \
            "GPU clocks not locked (normal clocks)"
        return f"{TIMING_MODES.get(mode, mode + ' mode')}; {clocks}"

    @cached_property
    def ncu_settings(self) -> list[dict]:
        """Distinct collection settings of the finished profile points, with their point counts."""
        seen: dict[tuple, int] = {}
        for p in self.profile_points:
            if p.get("status") != "ok":
                continue
            key = (p.get("cache_control"), p.get("clock_control"), p.get("replay_mode"), p.get("metric_set"),
                   p.get("ncu_version"), p.get("scoping"))
            seen[key] = seen.get(key, 0) + 1
        return [{"cache_control": k[0], "clock_control": k[1], "replay_mode": k[2], "metric_set": k[3],
                 "ncu_version": k[4], "scoping": k[5], "points": n} for k, n in seen.items()]

    def ncu_mode(self, cache: Any, clock: Any) -> str:
        replays = {s["replay_mode"] for s in self.ncu_settings
                   if s["cache_control"] == cache and s["clock_control"] == clock and s["replay_mode"]}
        return ncu_mode_text(cache, clock, ", ".join(sorted(replays)) or None)

    @property
    def gpu(self) -> dict:
        return self.meta.get("gpu") or {}


class ImportSource:
    """An Nsight Compute report or CSV export of any application."""

    kind = "import"

    def __init__(self, path: Path, index: int):
        from .extract import read_any, wide

        self.path = path
        self.index = index
        self.slug = f"s{index}"
        self.label = path.name
        self.errors: dict[str, str] = {}
        self.metrics = read_any(path, run=path.stem)
        self.kernels = wide(self.metrics)

    @cached_property
    def rules(self) -> pd.DataFrame:
        from .extract import rule_results

        try:
            return rule_results(self.path, run=self.path.stem, allow_partial=True)
        except CharacterizeError as e:
            self.errors["rules"] = str(e)
            return pd.DataFrame()


@dataclass
class Pair:
    """Two sources compared: `b` against the reference `a`."""

    a: Any
    b: Any
    index: int

    @property
    def slug(self) -> str:
        return f"c{self.index}"

    @property
    def label(self) -> str:
        return f"{self.b.label} vs {self.a.label}"


def open_source(src: Any, index: int) -> RunSource | ImportSource:
    """A run directory, Run object, or report file as a report source."""
    if isinstance(src, Run):
        return RunSource(src, index)
    p = Path(src)
    if p.is_dir():
        return RunSource(load_run(p), index)
    if p.is_file():
        return ImportSource(p, index)
    raise ReportError(f"{p}: no such run directory or report file; give run directories (with meta.json), "
                      ".ncu-rep files or ncu CSV exports")


# ====================================================================== needs
@dataclass(frozen=True)
class Need:
    """A piece of data a panel needs: how to tell it is there, and why it is not."""

    name: str
    description: str
    present: Callable[[Any], bool]
    why_missing: Callable[[Any], str]


def _step(src: RunSource, name: str) -> str | None:
    s = (src.meta.get("steps") or {}).get(name)
    return None if s in (None, "done") else str(s)


def _points_missing(src: RunSource, kind: str, hint: str) -> str:
    points = src.bench_points if kind == "bench" else src.profile_points
    failed = [p for p in points if p.get("status") != "ok"]
    if points and len(failed) == len(points):
        return f"all {len(points)} {kind} point(s) failed (errors listed under Failures)"
    if src.errors.get(kind):
        return f"the {kind} results could not be read: {src.errors[kind]}"
    step = _step(src, kind)
    if step:
        return f"not measured: the {kind} step was {step}. {hint}"
    if not src.gpu and kind in ("bench", "profile"):
        return f"not measured: this run was made without a CUDA GPU and has no {kind} points. {hint}"
    return f"not measured: the run directory has no {kind} points. {hint}"


_BENCH_HINT = ("Time the kernels on a GPU with `characterize bench EXPERIMENT --out RUN_DIR --resume` "
               "(`--backend emulate` checks the harness on the CPU).")
_PROFILE_HINT = "Profile on a GPU with `characterize profile EXPERIMENT --out RUN_DIR --resume`."


def _both(pred: Callable[[Any], bool], why: Callable[[Any], str]) -> tuple[Callable, Callable]:
    """Lift a per-source need to a Pair (both sides must have it)."""
    def present(s: Any) -> bool:
        return pred(s.a) and pred(s.b) if isinstance(s, Pair) else pred(s)

    def missing(s: Any) -> str:
        if not isinstance(s, Pair):
            return why(s)
        side = s.a if not pred(s.a) else s.b
        return f"{side.label}: {why(side)}"
    return present, missing


def _has_bench(s: Any) -> bool:
    return isinstance(s, RunSource) and not s.bench_ok.empty


def _bench_why(s: Any) -> str:
    return _points_missing(s, "bench", _BENCH_HINT) if isinstance(s, RunSource) else \
        "an imported ncu report holds no CUDA-event timings"


def _has_metrics(s: Any) -> bool:
    return not s.metrics.empty


def _metrics_why(s: Any) -> str:
    return _points_missing(s, "profile", _PROFILE_HINT) if isinstance(s, RunSource) else "the report holds no metrics"


NEEDS: dict[str, Need] = {n.name: n for n in (
    Need("meta", "meta.json of the run", lambda s: bool(s.meta), lambda s: "meta.json holds nothing"),
    Need("locality", "trace locality statistics (locality.json)", lambda s: bool(s.run.locality_raw),
         lambda s: (f"the locality step was {_step(s, 'locality')}" if _step(s, "locality") else
                    "no locality.json in the run directory; `characterize run` writes it (no GPU needed)")),
    Need("static", "static characterization (static.csv)", lambda s: not s.static_config.empty,
         lambda s: s.errors.get("static") or (f"the static step was {_step(s, 'static')}" if _step(s, "static")
                                              else "no static.csv in the run directory; `characterize run` or "
                                                   "`characterize build` computes it (nvcc, no GPU needed)")),
    Need("sweep", "register-sweep rows of static.csv", lambda s: not s.static_sweep.empty,
         lambda s: ("no register-sweep rows in static.csv (the experiment lists no maxrregcount values)"
                    if not s.static.empty else NEEDS["static"].why_missing(s))),
    Need("bench", "timed points (points/bench)", *_both(_has_bench, _bench_why)),
    Need("profile", "profiled points with ncu metrics (points/profile, ncu/*.ncu-rep)",
         *_both(_has_metrics, _metrics_why)),
    Need("predictions", "model predictions (predictions.csv)", lambda s: not s.predictions.empty,
         lambda s: s.errors.get("predictions") or "no predictions.csv in the run directory: the model step has "
                                                  "not been run for this run (predictions are labelled as such)"),
    Need("kernels", "per-kernel metrics of the report", lambda s: not s.kernels.empty,
         lambda s: "the report holds no kernels"),
)}


# ===================================================================== panels
@dataclass(frozen=True)
class Panel:
    """One panel of the report, as data.

    id: anchor (unique within a source); title; section: the heading it sits under;
    needs: keys of NEEDS checked before the builder runs (a missing one shows its
    reason instead); provenance: keys of PROVENANCE, or a function of the source
    returning them; how: how the numbers were obtained; builder: source -> PanelOutput.
    """

    id: str
    title: str
    section: str
    needs: tuple[str, ...]
    provenance: tuple[str, ...] | Callable[[Any], tuple[str, ...]]
    how: str
    builder: Callable[[Any], PanelOutput]


def _timing_prov(s: Any) -> tuple[str, ...]:
    if isinstance(s, Pair):
        return tuple(dict.fromkeys(_timing_prov(s.a) + _timing_prov(s.b)))
    return (s.timing_provenance,) if isinstance(s, RunSource) else ()


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
        ["trace locality", status(bool(s.run.locality_raw)),
         f"{len(s.run.locality_raw)} dataset(s)" if s.run.locality_raw else NEEDS["locality"].why_missing(s),
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
    if not (s.bench_ok["variant"] == "base").any():
        raise Missing("the reference variant base was not timed, so there is no speedup over base")
    blocks: list[Any] = []
    if s.emulated:
        blocks.append(NoteBlock("These ratios come from CPU emulation. They check that the harness works and say "
                                "NOTHING about GPU performance: do not compare them with the paper's claims.",
                                "warning"))
    claims = analyze.PAPER_CLAIMS
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


# -------------------------------------------------------------- run: locality
def _l2_marks(s: RunSource, row_bytes: int | None) -> dict[str, int]:
    if not row_bytes:
        return {}
    try:
        from .hardware import DEFAULT_GPU, GPUS
    except ImportError:  # pragma: no cover
        return {}
    marks = {}
    for arch in (s.meta.get("experiment") or {}).get("archs", []):
        spec = GPUS.get(DEFAULT_GPU.get(arch, ""))
        if spec is not None:
            marks[f"{spec.name} L2"] = spec.l2_bytes // row_bytes
    return marks


def _p_locality(s: RunSource) -> PanelOutput:
    from .plots import coverage_figure, order_datasets, reuse_figure

    raw = s.run.locality_raw
    names = order_datasets(raw)
    ks = sorted({int(k) for d in raw.values() for k in (d.get("top_k_coverage") or {})})
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
    spec += [("bytes touched", _col("bytes_touched", fmt_bytes))]
    blocks: list[Any] = [_table(rows, spec, caption="One table of each dataset (tables share a distribution)",
                                note="reuse distance: distinct rows read between two reads of the same row; "
                                     "top-K coverage: fraction of lookups that hit the K most frequent rows")]
    descs = [(ds, raw[ds].get("description")) for ds in names if raw[ds].get("description")]
    if descs:
        blocks.append(_kv(descs, caption="Dataset definitions"))
    row_bytes = next((d.get("row_bytes") for d in raw.values() if d.get("row_bytes")), None)
    mode = "no caches or clocks involved; dotted lines: rows of this size that fill each target GPU's L2"
    blocks.append(_figure_block(coverage_figure(raw, _l2_marks(s, row_bytes), "Top-K coverage per dataset"),
                                "Top-K coverage", f"{PROVENANCE['trace'].label}: {mode}"))
    if any(d.get("reuse_histogram") for d in raw.values()):
        blocks.append(_figure_block(reuse_figure(raw, "Reuse-distance distribution"), "Reuse-distance distribution",
                                    f"{PROVENANCE['trace'].label}; log2 bins; first reads (no earlier read) in the "
                                    "legend"))
    return PanelOutput(blocks)


# ---------------------------------------------------------------- run: static
def _p_static(s: RunSource) -> PanelOutput:
    from .plots import static_occupancy_figure

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
    from .plots import register_sweep_figure

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


# ---------------------------------------------------------------- run: timing
def _p_latency(s: RunSource) -> PanelOutput:
    from .plots import latency_figure

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
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


def _p_speedup(s: RunSource) -> PanelOutput:
    from .plots import speedup_figure

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
    from .plots import bandwidth_figure

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
    from .plots import prepass_figure

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
_NCU_COLS = ["achieved_occupancy_pct", "theoretical_occupancy_pct", "registers_per_thread", "l1_hit_rate_pct",
             "l2_hit_rate_pct", "dram_bytes_read", "duration_ns"]


def _ncu_groups(s: RunSource) -> list[tuple[str, Any, Any, pd.DataFrame]]:
    """(mode text, cache, clock, per-point means of the lookup kernels) per collection mode."""
    k = s.lookup
    if k.empty:
        raise Missing("no lookup kernels among the profiled kernels")
    k = k.copy()
    for c in ("cache_control", "clock_control"):
        if c not in k.columns:
            k[c] = ""
        k[c] = k[c].fillna("").astype(str)
    out = []
    for (cache, clock), g in k.groupby(["cache_control", "clock_control"], sort=True):
        cols = [c for c in _NCU_COLS if c in g.columns]
        agg = g.groupby(["variant", "dataset"], as_index=False).agg(
            **{c: (c, "mean") for c in cols}, kernels=("kernel_id", "size"))
        out.append((s.ncu_mode(cache or None, clock or None), cache, clock, _order(agg)))
    return out


def _ncu_prov_modes(s: RunSource) -> str:
    return "; ".join(mode for mode, *_ in _ncu_groups(s))


def _p_occupancy(s: RunSource) -> PanelOutput:
    from .plots import occupancy_figure

    blocks: list[Any] = []
    for mode, _, _, agg in _ncu_groups(s):
        blocks.append(_figure_block(occupancy_figure(agg, "Achieved vs theoretical occupancy (lookup kernels)"),
                                    "Occupancy", f"{PROVENANCE['ncu'].label}; {mode}"))
        spec = [*POINT_COLS,
                ("kernels", _col("kernels")), ("registers/thread", _col("registers_per_thread")),
                ("theoretical", _col("theoretical_occupancy_pct", fmt_pct)),
                ("achieved", _col("achieved_occupancy_pct", fmt_pct))]
        blocks.append(_table(agg, spec, caption=f"Mean over the profiled lookup kernels of each point — {mode}"))
    return PanelOutput(blocks, modes=_ncu_prov_modes(s))


def _p_stalls(s: RunSource) -> PanelOutput:
    from .plots import stall_figure

    blocks: list[Any] = []
    k = s.lookup.copy()
    for c in ("cache_control", "clock_control"):
        k[c] = k[c].fillna("").astype(str) if c in k.columns else ""
    for (cache, clock), g in k.groupby(["cache_control", "clock_control"], sort=True):
        st = analyze.stall_breakdown(g)
        mode = s.ncu_mode(cache or None, clock or None)
        if st.empty or st["cycles"].fillna(0).sum() == 0:
            blocks.append(NoteBlock(f"No warp-stall metrics in the reports ({mode}); the WarpStateStats section "
                                    "was not collected."))
            continue
        blocks.append(_figure_block(stall_figure(st, "Warp-stall breakdown (lookup kernels)"), "Warp stalls",
                                    f"{PROVENANCE['ncu'].label}; {mode}; cycles per issued instruction "
                                    "(smsp__average_warps_issue_stalled_*_per_issue_active)"))
        totals = st.groupby("reason")["cycles"].sum().sort_values(ascending=False)
        top = [r for r in totals.index if totals[r] > 0][:6]
        wide = st.pivot_table(index=["variant", "dataset"], columns="reason", values="cycles").reset_index()
        wide["total"] = wide[[c for c in wide.columns if c not in ("variant", "dataset")]].sum(axis=1)
        spec = list(POINT_COLS)
        spec += [(r.replace("_", " "), _col(r)) for r in top] + [("all reasons", _col("total"))]
        blocks.append(_table(_order(wide), spec,
                             caption=f"Stall cycles per issued instruction, largest reasons — {mode}"))
    return PanelOutput(blocks, modes=_ncu_prov_modes(s))


def _p_memory(s: RunSource) -> PanelOutput:
    from .plots import dram_figure, hit_rate_figure

    blocks: list[Any] = []
    for mode, cache, _, agg in _ncu_groups(s):
        note = "" if cache == "none" else \
            " L2 pinning is invisible under this mode: caches were flushed before each kernel."
        rates = ["l1_hit_rate_pct", "l2_hit_rate_pct"]
        if set(rates) <= set(agg.columns) and agg[rates].notna().any().any():
            blocks.append(_figure_block(hit_rate_figure(agg, "L1 and L2 hit rates (lookup kernels)"), "Hit rates",
                                        f"{PROVENANCE['ncu'].label}; {mode}.{note}"))
        if "dram_bytes_read" in agg.columns and agg["dram_bytes_read"].notna().any():
            blocks.append(_figure_block(dram_figure(agg, "DRAM bytes read (lookup kernels)"), "DRAM bytes",
                                        f"{PROVENANCE['ncu'].label}; {mode}"))
        spec = [*POINT_COLS,
                ("L1 hit", _col("l1_hit_rate_pct", fmt_pct)), ("L2 hit", _col("l2_hit_rate_pct", fmt_pct)),
                ("DRAM read", _col("dram_bytes_read", fmt_bytes)),
                ("duration (µs, under ncu)", lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num"))]
        blocks.append(_table(agg, spec, caption=f"Memory hierarchy per point — {mode}",
                             note="durations under the profiler (replay, locked clocks) are not latencies; "
                                  "the Timing section has those"))
    return PanelOutput(blocks, modes=_ncu_prov_modes(s))


def _kernel_table(k: pd.DataFrame, caption: str, with_point: bool = True) -> TableBlock:
    spec: list[tuple[str, Callable]] = []
    if with_point:
        spec += [("variant", lambda r: Cell(_txt(r.get("variant")), "code")),
                 ("dataset", lambda r: Cell(_txt(r.get("dataset")), "code")),
                 ("table", lambda r: Cell(_txt(r.get("table")), "num"))]
    spec += [("ID", _col("kernel_id")),
             ("kernel", lambda r: kernel_cell(r.get("kernel_name"), r.get("function"))),
             ("grid / block",
              lambda r: Cell(f"{_txt(r.get('grid')) or '–'} / {_txt(r.get('block')) or '–'}", "code")),
             ("duration (µs)", lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num")),
             ("regs", _col("registers_per_thread")),
             ("occupancy achieved / theoretical", lambda r: Cell(
                 f"{fmt_pct(r.get('achieved_occupancy_pct'))} / {fmt_pct(r.get('theoretical_occupancy_pct'))}", "num")),
             ("L1 hit", _col("l1_hit_rate_pct", fmt_pct)), ("L2 hit", _col("l2_hit_rate_pct", fmt_pct)),
             ("DRAM read", _col("dram_bytes_read", fmt_bytes)), ("DRAM busy", _col("dram_throughput_pct", fmt_pct)),
             ("SM busy", _col("sm_throughput_pct", fmt_pct))]
    if with_point:
        spec.append(("ncu modes", lambda r: Cell(f"cache {_txt(r.get('cache_control')) or '?'}, "
                                                 f"clock {_txt(r.get('clock_control')) or '?'}", "")))
    else:
        spec.insert(2, ("NVTX range", lambda r: Cell(_txt(r.get("nvtx_range")), "code")))
        spec.insert(3, ("device", lambda r: Cell(_txt(r.get("device")), "")))
    return _table(k, spec, caption=caption)


def _p_kernels(s: RunSource) -> PanelOutput:
    k = _order(s.kernels)
    return PanelOutput([_kernel_table(k, "Every profiled kernel (lookup kernels and L2 pre-pass kernels)")],
                       modes="; ".join(s.ncu_mode(st["cache_control"], st["clock_control"]) for st in s.ncu_settings))


_SEVERITY = {"ERROR": 0, "WARNING": 1, "OPTIMIZATION": 2, "INFO": 3, "OK": 4, "NONE": 5}


def _rule_blocks(rules: pd.DataFrame) -> list[Any]:
    """One collapsible block per kernel: findings grouped by rule, most severe first."""
    blocks = []
    for (kid, kname), g in rules.groupby(["kernel_id", "kernel_name"], sort=True):
        grouped = []
        for (mtype, rule, title), r in g.groupby(["message_type", "rule_name", "title"], sort=False):
            msgs = list(dict.fromkeys(clean_rule_text(m) for m in r["message"]))
            grouped.append({"type": mtype, "rule": rule or r["rule"].iloc[0], "title": title, "message": msgs[0],
                            "more": len(msgs) - 1, "speedup": r["estimated_speedup"].max(),
                            "speedup_type": next((t for t in r["speedup_type"] if t), "")})
        grouped.sort(key=lambda x: (_SEVERITY.get(x["type"], 9), -(0 if _isnan(x["speedup"]) else x["speedup"])))
        counts = g["message_type"].value_counts()
        summary = ", ".join(f"{n} {t.lower()}" for t, n in counts.items())
        spec = [("type", lambda r: Cell(r["type"], "rule-" + r["type"].lower())),
                ("rule", lambda r: Cell(r["rule"], "")), ("finding", lambda r: Cell(r["title"], "")),
                ("message", lambda r: Cell(r["message"] + (f" (+{r['more']} similar)" if r["more"] else ""), "msg")),
                ("estimated speedup", lambda r: Cell("–" if _isnan(r["speedup"]) else
                                                     f"{r['speedup']:.0f}% ({r['speedup_type'] or '?'})", "num"))]
        shown = kernel_cell(kname).text
        full = [NoteBlock(f"Kernel: {kname}")] if shown != kname else []
        blocks.append(DetailsBlock(f"kernel #{kid} {shown}: {len(g)} finding(s): {summary}",
                                   full + [_table(grouped, spec)],
                                   open=bool(counts.get("ERROR", 0))))
    return blocks


def _p_rules(s: RunSource) -> PanelOutput:
    from .extract import rule_results

    blocks: list[Any] = []
    points = [p for p in s.profile_points if p.get("status") == "ok" and p.get("report")]
    if not points:
        raise Missing(_points_missing(s, "profile", _PROFILE_HINT))
    for p in _order(pd.DataFrame(points)).to_dict("records"):
        path = s.run.path / p["report"]
        head = f"{p['variant']} · {p['dataset']} (cache-control {p.get('cache_control') or '?'}, " \
               f"clock-control {p.get('clock_control') or '?'})"
        try:
            rules = rule_results(path, run=s.run.name, allow_partial=True)
        except CharacterizeError as e:
            blocks.append(NoteBlock(f"{head}: rule findings could not be read: {e}", "warning"))
            continue
        if rules.empty:
            blocks.append(NoteBlock(f"{head}: the report holds no rule findings."))
            continue
        blocks.append(DetailsBlock(f"{head}: {len(rules)} finding(s)", _rule_blocks(rules)))
    return PanelOutput(blocks, modes="; ".join(s.ncu_mode(st["cache_control"], st["clock_control"])
                                               for st in s.ncu_settings))


# ----------------------------------------------------------------- run: model
def _predicted_headline(d: pd.DataFrame, gpu: str) -> TableBlock:
    """Technique x hotness -> predicted speedup over base, beside the paper's claims."""
    from .plots import order_datasets

    table = d.pivot_table(index="variant", columns="dataset", values="speedup_vs_base", aggfunc="mean")
    datasets = order_datasets(table.columns)
    rows = []
    for v in _order(pd.DataFrame({"variant": table.index}))["variant"]:
        vals = [table.loc[v, ds] for ds in datasets]
        best = max((x for x in vals if not _isnan(x)), default=np.nan)
        rows.append([Cell(v, "code")] + [Cell(fmt_x(x), "num") for x in vals] +
                    [Cell("–" if _isnan(best) else f"{100 * (best - 1):+.0f}%", "num"),
                     Cell(analyze.PAPER_CLAIMS.get(v, ""), "claim")])
    return TableBlock(["variant"] + datasets + ["best over base", "paper (A100, embedding stage)"], rows,
                      caption=f"PREDICTED speedup over base{' on ' + gpu if gpu else ''} (model, not a measurement)")


def _p_predictions(s: RunSource) -> PanelOutput:
    from .plots import prediction_figure

    p = s.predictions.copy()
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
                         ("speedup_vs_base", "predicted vs base", fmt_x),
                         ("l2_hit_rate_pct", "predicted L2 hit", fmt_pct),
                         ("dram_bytes", "predicted DRAM bytes", fmt_bytes),
                         ("l2_bytes", "predicted L2 bytes", fmt_bytes),
                         ("bound", "bound by", _txt), ("constants", "constants", _txt), ("note", "note", _txt)):
        if col in p.columns:
            spec.append((head, _col(col, f, "num" if f is not _txt else "")))
    blocks.append(DetailsBlock(f"Prediction table ({len(p)} rows)", [_table(_order(p), spec,
                                                                            caption="PREDICTED by the model")]))
    v = s.run.model_validation
    if not v.empty:
        vspec = [(c, _col(c, _txt)) for c in ("claim", "paper", "model", "agrees", "gpu", "constants") if c in v.columns]
        blocks.append(_table(v, vspec, caption="The model against the MICRO 2024 paper's A100 claims (paper "
                                               "configuration on sm_80; model PREDICTIONS vs published measurements)"))
    return PanelOutput(blocks)


def _p_predicted_vs_measured(s: RunSource) -> PanelOutput:
    from .plots import predicted_vs_measured_figure

    if s.emulated:
        raise Missing("the timings are CPU emulation; predictions of GPU time are compared with GPU measurements "
                      "only")
    key = s.gpu.get("key")
    p = s.predictions
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


def _p_failures(s: RunSource) -> PanelOutput:
    f = s.failures  # failed points and unreadable reports (store.Run.failures)
    if f.empty:
        return PanelOutput([NoteBlock("No failed points.")])
    spec = [("kind", lambda r: Cell(str(r["kind"]), "")), ("variant", lambda r: Cell(str(r["variant"]), "code")),
            ("dataset", lambda r: Cell(str(r["dataset"]), "code")), ("error", lambda r: Cell(_txt(r["error"]), "msg"))]
    return PanelOutput([_table(_order(f), spec, caption=f"{len(f)} point(s) failed; the other points are unaffected")])


# -------------------------------------------------------------- import panels
def _i_summary(s: ImportSource) -> PanelOutput:
    w = s.kernels
    devices = sorted({str(d) for d in w.get("device", pd.Series(dtype=str)).dropna() if str(d)})
    rows = [("file", str(s.path)), ("size", fmt_bytes(s.path.stat().st_size)), ("kernels", len(w)),
            ("metric values", len(s.metrics)), ("distinct metrics", s.metrics["metric"].nunique()),
            ("device", ", ".join(devices) or "not recorded"),
            ("collection modes", "not recorded in the exported metrics: ncu's defaults are --cache-control all "
                                 "(caches flushed before each kernel) and --clock-control base (locked clocks) "
                                 "unless the profiler was told otherwise")]
    return PanelOutput([_kv(rows)], modes="ncu collection modes not recorded in the report")


def _i_kernels(s: ImportSource) -> PanelOutput:
    return PanelOutput([_kernel_table(s.kernels, "One row per profiled kernel (friendly metric names)",
                                      with_point=False)], modes="ncu collection modes not recorded in the report")


def _i_figures(s: ImportSource) -> PanelOutput:
    from .plots import kernel_duration_figure, kernel_occupancy_figure

    w = s.kernels
    blocks: list[Any] = []
    cap = f"{PROVENANCE['ncu'].label}; collection modes not recorded in the report"
    if "duration_ns" in w.columns and w["duration_ns"].notna().any():
        blocks.append(_figure_block(kernel_duration_figure(w, "Duration per kernel"), "Duration", cap))
    if w[["achieved_occupancy_pct", "theoretical_occupancy_pct"]].notna().any().any():
        blocks.append(_figure_block(kernel_occupancy_figure(w, "Occupancy per kernel"), "Occupancy", cap))
    if not blocks:
        raise Missing("the report has neither durations nor occupancy metrics")
    return PanelOutput(blocks, modes="ncu collection modes not recorded in the report")


def _i_stalls(s: ImportSource) -> PanelOutput:
    from .plots import kernel_stall_figure

    w = s.kernels
    cols = [c for c in w.columns if c.startswith("stall_")]
    if not cols or not w[cols].fillna(0).to_numpy().any():
        raise Missing("the report has no warp-stall metrics (the WarpStateStats section was not collected)")
    blocks: list[Any] = [_figure_block(kernel_stall_figure(w, "Warp-stall breakdown per kernel"), "Warp stalls",
                                       f"{PROVENANCE['ncu'].label}; collection modes not recorded in the report; "
                                       "cycles per issued instruction")]
    d = w[w[cols].notna().any(axis=1)]
    totals = d[cols].fillna(0).sum().sort_values(ascending=False)
    top = [c for c in totals.index if totals[c] > 0][:6]
    spec = [("ID", _col("kernel_id")), ("kernel", lambda r: kernel_cell(r.get("kernel_name"), r.get("function")))]
    spec += [(c.removeprefix("stall_").replace("_", " "), _col(c)) for c in top]
    blocks.append(_table(d, spec, caption="Stall cycles per issued instruction, largest reasons"))
    return PanelOutput(blocks, modes="ncu collection modes not recorded in the report")


def _i_rules(s: ImportSource) -> PanelOutput:
    r = s.rules
    if r.empty:
        raise Missing(s.errors.get("rules") or "the file holds no rule findings (a CSV raw page carries none)")
    return PanelOutput(_rule_blocks(r), modes="ncu collection modes not recorded in the report")


# ------------------------------------------------------------- compare panels
_COMPARE_METRICS = {
    "gpu__time_duration.sum": ("duration", lambda v: fmt_num(v / 1e3) + " µs"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved occupancy", fmt_pct),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical occupancy", fmt_pct),
    "launch__registers_per_thread": ("registers/thread", fmt_num),
    "l1tex__t_sector_hit_rate.pct": ("L1 hit rate", fmt_pct),
    "lts__t_sector_hit_rate.pct": ("L2 hit rate", fmt_pct),
    "dram__bytes_read.sum": ("DRAM bytes read", fmt_bytes),
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": ("long-scoreboard stall", fmt_num),
}


def _unmatched_table(un: pd.DataFrame, keys: Sequence[str], pair: Pair, what: str) -> list[Any]:
    if un.empty:
        return [NoteBlock(f"Every {what} is present in both.")]
    names = {"a": pair.a.label, "b": pair.b.label}
    spec = [(k, (lambda k: lambda r: Cell(_txt(r.get(k)), "code"))(k)) for k in keys]
    spec.append(("only in", lambda r: Cell(names.get(r["only_in"], str(r["only_in"])), "")))
    return [_table(_order(un), spec, caption=f"Unmatched {what}s ({len(un)}): present on one side only, "
                                             "listed instead of dropped")]


def _c_bench(pair: Pair) -> PanelOutput:
    a, b = pair.a, pair.b

    def tidy(src: RunSource) -> pd.DataFrame:
        d = src.bench_ok
        cols = [c for c in ("per_table_us", "effective_GBps") if c in d.columns]
        return d.melt(id_vars=["variant", "dataset", "mode"], value_vars=cols, var_name="metric", value_name="value")

    both, un = analyze.compare_runs(tidy(a), tidy(b), keys=("variant", "dataset", "mode"))
    blocks: list[Any] = []
    if a.timing_provenance != b.timing_provenance:
        blocks.append(NoteBlock(f"{a.label} is {PROVENANCE[a.timing_provenance].label} and {b.label} is "
                                f"{PROVENANCE[b.timing_provenance].label}: their ratios compare different things.",
                                "warning"))
    elif a.emulated:
        blocks.append(NoteBlock("Both sides are CPU emulation: NOT GPU performance.", "warning"))
    lat = _order(both[both["metric"] == "per_table_us"])
    spec = [*POINT_COLS,
            ("mode", _col("mode", _txt, "")), (f"{a.label} (µs)", _col("a")), (f"{b.label} (µs)", _col("b")),
            ("speedup of b over a", lambda r: Cell(fmt_x(r["a"] / r["b"] if r["b"] else np.nan), "num"))]
    blocks.append(_table(lat, spec, caption="Latency per table launch on both sides (b: " + b.label + ")"))
    blocks += _unmatched_table(un, ["variant", "dataset", "mode"], pair, "timed point")
    return PanelOutput(blocks, provenance=_timing_prov(pair),
                       modes="both sides: " + "; ".join(a.timing_mode(m) for m in a.modes))


def _c_metrics(pair: Pair) -> PanelOutput:
    a, b = pair.a, pair.b

    def labelled(side: Any) -> bool:
        m = side.metrics
        return "variant" in m.columns and m["variant"].fillna("").astype(str).ne("").any()

    # a report of another application has no variant/dataset: match its kernels by function only
    keys = ("variant", "dataset", "function") if labelled(a) and labelled(b) else ("function",)
    both, un = analyze.compare_runs(a.metrics, b.metrics, keys=keys)
    both = both[both["metric"].isin(_COMPARE_METRICS)].copy()
    keys_present = [k for k in keys if k in both.columns or k in un.columns]
    blocks: list[Any] = []
    if keys == ("function",):
        blocks.append(NoteBlock("One side carries no variant/dataset labels, so kernels are matched by function "
                                "name only; several kernels with one name are averaged."))
    if not both.empty:
        both["_m"] = both["metric"].map(list(_COMPARE_METRICS).index)
        both = _order(both.sort_values("_m", kind="stable"))
        spec = [(k, (lambda k: lambda r: kernel_cell(r.get(k)) if k == "function" else Cell(_txt(r.get(k)), "code"))(k))
                for k in keys_present]
        spec += [("metric", lambda r: Cell(_COMPARE_METRICS[r["metric"]][0], "")),
                 (pair.a.label, lambda r: Cell(_COMPARE_METRICS[r["metric"]][1](r["a"]), "num")),
                 (pair.b.label, lambda r: Cell(_COMPARE_METRICS[r["metric"]][1](r["b"]), "num")),
                 ("b / a", lambda r: Cell(fmt_num(r["ratio"]), "num"))]
        blocks.append(_table(both, spec, caption="Key Nsight Compute metrics of the kernels both sides profiled"))
    else:
        blocks.append(NoteBlock("No kernel is present on both sides under the same " + ", ".join(keys) + "."))
    blocks += _unmatched_table(un, keys_present, pair, "kernel")
    modes = []
    for side in (a, b):
        if isinstance(side, RunSource):
            modes.append(f"{side.label}: " + "; ".join(side.ncu_mode(st["cache_control"], st["clock_control"])
                                                       for st in side.ncu_settings))
        else:
            modes.append(f"{side.label}: ncu collection modes not recorded in the report")
    return PanelOutput(blocks, modes=" | ".join(modes))


# --------------------------------------------------------------- the panel lists
S_OVERVIEW, S_LOCALITY, S_STATIC, S_TIMING = "Overview", "Workload locality", "Static characterization", "Timing"
S_NCU, S_RULES, S_MODEL, S_FAIL = "Microarchitecture (Nsight Compute)", "Nsight Compute rule findings", \
    "Model predictions", "Failures"

RUN_PANELS: tuple[Panel, ...] = (
    Panel("environment", "Environment", S_OVERVIEW, ("meta",), ("meta",),
          "GPU, driver, clocks, collection modes, versions and command line as recorded in meta.json and the "
          "point files", _p_environment),
    Panel("contents", "What this run holds", S_OVERVIEW, (), ("meta",),
          "which stages left results in the run directory, and why the others did not", _p_contents),
    Panel("headline", "Headline: technique × hotness → speedup over base", S_OVERVIEW, ("bench",), _timing_prov,
          "analyze.headline(): ratio of the mean per-table latency of base to that of each variant, per dataset, "
          "set beside the MICRO 2024 paper's A100 claims (analyze.PAPER_CLAIMS)", _p_headline),
    Panel("locality", "Trace locality per dataset", S_LOCALITY, ("locality",), ("trace",),
          "unique rows, top-K coverage and reuse distances of one table's index stream per dataset "
          "(locality.json, exact reuse distances)", _p_locality),
    Panel("static", "Registers, spills and theoretical occupancy", S_STATIC, ("static",), ("static",),
          "each variant compiled with nvcc per architecture as configured; ptxas -v resources into the occupancy "
          "calculator (static.csv rows with sweep = False)", _p_static),
    Panel("sweep", "Register sweep", S_STATIC, ("sweep",), ("static",),
          "the lookup kernels recompiled with each -maxrregcount of the experiment (static.csv rows with "
          "sweep = True)", _p_sweep),
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
    Panel("occupancy", "Achieved vs theoretical occupancy", S_NCU, ("profile",), ("ncu",),
          "sm__warps_active (achieved) and sm__maximum_warps_per_active_cycle_pct (theoretical) of the profiled "
          "lookup kernels, averaged per point", _p_occupancy),
    Panel("stalls", "Warp-stall breakdown", S_NCU, ("profile",), ("ncu",),
          "WarpStateStats stall reasons in cycles per issued instruction (analyze.stall_breakdown)", _p_stalls),
    Panel("memory", "L1/L2 hit rates and DRAM traffic", S_NCU, ("profile",), ("ncu",),
          "l1tex__t_sector_hit_rate, lts__t_sector_hit_rate and dram__bytes_read of the lookup kernels",
          _p_memory),
    Panel("kernels", "Every profiled kernel", S_NCU, ("profile",), ("ncu",),
          "one row per kernel in the run's reports (extract.wide)", _p_kernels),
    Panel("rules", "Nsight Compute rule findings per point", S_RULES, ("profile",), ("ncu",),
          "ncu's own guided-analysis rules as stored in each point's report (extract.rule_results)", _p_rules),
    Panel("predictions", "Model predictions", S_MODEL, ("predictions",), ("model",),
          "predictions.csv written by the model step; predictions, not measurements", _p_predictions),
    Panel("predicted-vs-measured", "Predicted vs measured", S_MODEL, ("predictions", "bench"),
          lambda s: ("model", s.timing_provenance),
          "predictions for the run's GPU joined with the measured points (and ncu L2 hit rates collected with "
          "--cache-control none)", _p_predicted_vs_measured),
    Panel("failures", "Failed points", S_FAIL, (), ("meta",),
          "points whose bench or profile step failed, with the recorded error (Run.failures)", _p_failures),
)

IMPORT_PANELS: tuple[Panel, ...] = (
    Panel("summary", "Report file", S_OVERVIEW, (), ("ncu",),
          "the file as read by extract.read_any (ncu_report for .ncu-rep, the CSV reader for exports)", _i_summary),
    Panel("kernels", "Per-kernel metrics", S_NCU, ("kernels",), ("ncu",),
          "one row per profiled kernel with friendly metric names (extract.wide)", _i_kernels),
    Panel("figures", "Duration and occupancy per kernel", S_NCU, ("kernels",), ("ncu",),
          "gpu__time_duration and achieved/theoretical occupancy of each kernel", _i_figures),
    Panel("stalls", "Warp stalls per kernel", S_NCU, ("kernels",), ("ncu",),
          "WarpStateStats stall reasons in cycles per issued instruction", _i_stalls),
    Panel("rules", "Nsight Compute rule findings", S_RULES, ("kernels",), ("ncu",),
          "ncu's guided-analysis rules stored in the report (extract.rule_results)", _i_rules),
)

COMPARE_PANELS: tuple[Panel, ...] = (
    Panel("bench", "Timing comparison", "Comparison", ("bench",), _timing_prov,
          "analyze.compare_runs on the timed points of both runs (per-table latency, effective bandwidth), "
          "matched on variant, dataset and mode", _c_bench),
    Panel("metrics", "Nsight Compute metrics comparison", "Comparison", ("profile",), ("ncu",),
          "analyze.compare_runs on the tidy ncu metrics of both sides, matched on variant, dataset and kernel "
          "function; kernels on one side only are listed", _c_metrics),
)


# ================================================================== rendering
@dataclass
class RenderedPanel:
    id: str
    title: str
    how: str
    needs: list[str]
    provenance: list[Provenance]
    modes: str
    blocks: list[Any] = field(default_factory=list)
    missing: str | None = None
    missing_need: bool = False  # the reason is a missing input (then the panel lists what it needs)
    error: str | None = None


@dataclass
class RenderedSection:
    id: str
    title: str
    panels: list[RenderedPanel]


@dataclass
class RenderedSource:
    id: str
    title: str
    kind: str
    sections: list[RenderedSection]


def _render_panel(panel: Panel, src: Any, strict: bool) -> RenderedPanel:
    try:
        prov_keys = panel.provenance(src) if callable(panel.provenance) else panel.provenance
    except Exception:  # noqa: BLE001 - a provenance that cannot be told is shown as unknown
        if strict:
            raise
        prov_keys = ()
    rp = RenderedPanel(f"{src.slug}-{panel.id}", panel.title, panel.how,
                       [NEEDS[n].description for n in panel.needs], [PROVENANCE[k] for k in prov_keys if k], "")
    for name in panel.needs:
        need = NEEDS[name]
        if not need.present(src):
            rp.missing = need.why_missing(src)
            rp.missing_need = True
            return rp
    try:
        out = panel.builder(src)
    except Missing as m:
        rp.missing = str(m)
        return rp
    except Exception as e:  # noqa: BLE001 - one broken panel must not cost the whole report
        if strict:
            raise
        rp.error = f"{type(e).__name__}: {e}"
        return rp
    rp.blocks = out.blocks
    rp.modes = out.modes
    if out.provenance is not None:
        rp.provenance = [PROVENANCE[k] for k in out.provenance]
    return rp


def _sections(panels: Sequence[Panel], src: Any, strict: bool) -> list[RenderedSection]:
    out: dict[str, RenderedSection] = {}
    for p in panels:
        sec = out.setdefault(p.section, RenderedSection(f"{src.slug}-sec-{_slug(p.section)}", p.section, []))
        sec.panels.append(_render_panel(p, src, strict))
    return list(out.values())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def build_report(sources: Any, *, title: str | None = None, strict: bool = False,
                 compare: bool = True) -> dict[str, Any]:
    """The template context of a report over `sources` (see render_report)."""
    items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
    if not items:
        raise ReportError("nothing to report: give at least one run directory or report file")
    srcs = [open_source(s, i) for i, s in enumerate(items, 1)]
    rendered = []
    for src in srcs:
        panels = RUN_PANELS if src.kind == "run" else IMPORT_PANELS
        kind = "run" if src.kind == "run" else "Nsight Compute report"
        rendered.append(RenderedSource(src.slug, src.label, kind, _sections(panels, src, strict)))
    comparisons = []
    for i, other in enumerate(srcs[1:] if compare else [], 1):
        pair = Pair(srcs[0], other, i)
        panels = [p for p in COMPARE_PANELS if p.id != "bench" or (src_is_run(pair.a) and src_is_run(pair.b))]
        comparisons.append(RenderedSource(pair.slug, pair.label, "comparison", _sections(panels, pair, strict)))
    used = sorted({p.key for r in rendered + comparisons for sec in r.sections for pn in sec.panels
                   for p in pn.provenance}, key=list(PROVENANCE).index)
    from . import __version__

    return {
        "title": title or "characterize report: " + ", ".join(s.label for s in srcs),
        "sources": rendered, "comparisons": comparisons, "provenance": [PROVENANCE[k] for k in used],
        "version": __version__, "css": (TEMPLATES / "report.css").read_text(),
    }


def src_is_run(s: Any) -> bool:
    return isinstance(s, RunSource)


def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def report_html(sources: Any, *, title: str | None = None, strict: bool = False, compare: bool = True) -> str:
    """The report as an HTML string (for notebooks: IPython.display.HTML(report_html(run)))."""
    import markupsafe

    ctx = build_report(sources, title=title, strict=strict, compare=compare)
    ctx["css"] = markupsafe.Markup(ctx["css"])  # our own stylesheet, never data
    return _environment().get_template("report.html").render(**ctx)


def render_report(sources: Any, output: str | Path, *, title: str | None = None, strict: bool = False,
                  compare: bool = True) -> Path:
    """Render one self-contained HTML report and return its path.

    sources: run directories or Run objects (full characterization report each) and
    ``.ncu-rep`` / ncu CSV files (generic per-kernel report each); a single source
    may be given bare. With two or more sources, each later one is also compared
    with the first (unmatched points and kernels are listed) unless compare=False.
    strict=True raises the first error of a panel builder instead of showing it.
    """
    out = Path(output)
    if out.is_dir():
        out = out / "report.html"
    write_atomic(out, report_html(sources, title=title, strict=strict, compare=compare))
    return out
