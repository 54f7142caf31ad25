"""Report stage, sources: a stored run or an imported Nsight Compute file, opened once,
with the frames panels read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from characterize.analysis import compare as analyze
from characterize.analysis import ncu
from characterize.analysis.model.predict import primary_predictions
from characterize.errors import CharacterizeError, ReportError
from characterize.extract.read import read_any, wide
from characterize.extract.rules import rule_results
from characterize.hardware.devices import throttle_verdict
from characterize.report.blocks import EMULATION_STAMP
from characterize.report.provenance import TIMING_MODES, ncu_mode_text
from characterize.store import Run, load_run


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
        self.rule_errors: list[str] = []

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
    def kview(self) -> pd.DataFrame:
        """One row per profiled kernel with speed-of-light, memory and stall columns
        (analysis.ncu.kernel_summary; time shares within each point's report)."""
        return ncu.kernel_summary(self.metrics) if not self.metrics.empty else pd.DataFrame()

    @cached_property
    def lookup_view(self) -> pd.DataFrame:
        return analyze.lookup_kernels(self.kview) if not self.kview.empty else pd.DataFrame()

    @cached_property
    def rules(self) -> pd.DataFrame:
        """ncu's rule findings of every profiled point, with the point's variant and dataset
        (a report that cannot be read is noted in `rule_errors`)."""
        frames = []
        for p in self.profile_points:
            if p.get("status") != "ok" or not p.get("report"):
                continue
            try:
                home = self.run.home("profile", p["variant"], p["dataset"])   # a merged run's part
                r = rule_results(home / p["report"], run=self.run.name, allow_partial=True)
            except CharacterizeError as e:
                self.rule_errors.append(f"{p['variant']} · {p['dataset']}: rule findings could not be read: {e}")
                continue
            r["variant"], r["dataset"] = p["variant"], p["dataset"]
            r["point"] = f"{p['variant']} · {p['dataset']}"
            frames.append(r)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @cached_property
    def locality_raw(self) -> dict:
        """locality.json of the run ({} when absent or damaged: the reason is in `errors`)."""
        try:
            return self.run.locality_raw
        except CharacterizeError as e:
            self.errors["locality"] = str(e)
            return {}

    @cached_property
    def sass(self) -> pd.DataFrame:
        """The SASS hot-loop table of the run."""
        try:
            return self.run.sass
        except (CharacterizeError, ValueError, pd.errors.ParserError) as e:
            self.errors["sass"] = str(e)
            return pd.DataFrame()

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
    def primary_predictions(self) -> pd.DataFrame:
        """The predictions at the run's own precision (and the cache at its default
        size): one row per variant x dataset x GPU x mode."""
        dtype = ((self.meta.get("experiment") or {}).get("workload") or {}).get("dtype")
        return primary_predictions(self.predictions, dtype)

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

    # ------------------------------------------------ measurement methodology
    @cached_property
    def clock_policies(self) -> dict[str, list[str]]:
        """The clock control each stage's finished points ran under ('none': unlocked,
        sampled by NVML; 'base': locked to base clocks), per stage."""
        out: dict[str, list[str]] = {}
        for stage, points in (("bench", self.bench_points), ("profile", self.profile_points)):
            found = {str(p.get("clock_control") or "not recorded") for p in points if p.get("status") == "ok"}
            if found:
                out[stage] = sorted(found)
        return out

    @cached_property
    def throttled_points(self) -> list[str]:
        """The finished bench points that ran throttled (NVML slowdown reasons or power
        or thermal violation time during the point), each with why: their times are
        slower than the GPU's normal clocks give."""
        out = []
        for p in self.bench_points:
            if p.get("status") != "ok":
                continue
            v = p.get("throttle") or throttle_verdict(p.get("clocks") or {})
            if v.get("throttled"):
                why = [*v.get("reasons", []), *(f"{k} limit {ms:.1f} ms" for k, ms in v.get("violation_ms", {}).items())]
                out.append(f"{p.get('variant')} {p.get('dataset')} ({', '.join(why)})")
        return out

    @property
    def mixed_clocks(self) -> str | None:
        """Why bench and profile durations are not comparable in this run, or None."""
        pol = self.clock_policies
        every = {c for cs in pol.values() for c in cs}
        if len(every) <= 1 or (self.emulated and "profile" not in pol):
            return None
        return ("mixed clocks: " + "; ".join(f"{stage} at {', '.join(cs)}" for stage, cs in pol.items()) +
                ": durations measured under different clock controls are not comparable")

    @cached_property
    def replay_modes(self) -> dict[str, list[str]]:
        """For each metric with its own replay mode (and 'default' for the rest), the
        modes the finished profile points took its values from."""
        out: dict[str, set[str]] = {}
        for p in self.profile_points:
            if p.get("status") != "ok":
                continue
            modes = p.get("replay_modes") or {"default": p.get("replay_mode") or "not recorded"}
            for metric, mode in modes.items():
                out.setdefault(metric, set()).add(str(mode))
        return {k: sorted(v) for k, v in out.items()}

    @cached_property
    def identity(self) -> dict[str, str]:
        """Where the GPU's identity fields came from (device API or spec table), as the
        first bench point that recorded it says."""
        for p in self.bench_points:
            if p.get("identity"):
                return dict(p["identity"])
        return {}


class ImportSource:
    """An Nsight Compute report or CSV export of any application."""

    kind = "import"

    def __init__(self, path: Path, index: int):
        self.path = path
        self.index = index
        self.slug = f"s{index}"
        self.label = path.name
        self.errors: dict[str, str] = {}
        self.metrics = read_any(path, run=path.stem)
        self.kernels = wide(self.metrics)
        self.kview = ncu.kernel_summary(self.metrics)

    @cached_property
    def profile_points(self) -> list[dict]:
        """The profile points of the run directory beside the report that name it
        (runs/x/ncu/R.ncu-rep and runs/x/points/profile/*.json), else []: an exported report
        has none. They tell the collection modes and how many tables each launch covers."""
        points = self.path.parent.parent / "points" / "profile"
        if self.path.parent.name != "ncu" or not points.is_dir():
            return []
        rel, out = f"ncu/{self.path.name}", []
        for f in sorted(points.glob("*.json")):
            try:
                pt = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(pt, dict) and rel in (pt.get("report"), pt.get("cache_report")):
                out.append({**pt, "_file": f.name})
        return out

    @cached_property
    def workload_tables(self) -> int | None:
        """T of the workload the points beside the report measured (their fingerprint),
        None without such points: what a batched launch (tbe) of a point that predates
        `tables_per_launch` covered."""
        for pt in self.profile_points:
            t = ((pt.get("fingerprint") or {}).get("workload") or {}).get("T")
            if isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 1:
                return int(t)
        return None

    @property
    def per_table(self) -> bool:
        """Whether the report's times, bytes and counts can be told per table: a run's points
        beside it say what each launch covered (else they stay per launch)."""
        return bool(self.profile_points)

    @cached_property
    def kview_per_table(self) -> pd.DataFrame:
        """kview with each batched launch divided by the tables it covers (analysis.ncu.per_table;
        unchanged for a report no run's points describe)."""
        return ncu.per_table(self.kview, self.profile_points, self.workload_tables)

    @cached_property
    def recorded_modes(self) -> str | None:
        """The collection modes the run directory beside the report recorded for it (the
        first profile point naming it), else None: an exported report does not record them."""
        for pt in self.profile_points:
            cache, clock = pt.get("cache_control"), pt.get("clock_control")
            if cache or clock:
                return (f"--cache-control {cache or 'not recorded'}, --clock-control {clock or 'not recorded'} "
                        f"(recorded by the run beside the report: points/profile/{pt['_file']})")
        return None

    @cached_property
    def rules(self) -> pd.DataFrame:
        try:
            return rule_results(self.path, run=self.path.stem, allow_partial=True)
        except CharacterizeError as e:
            self.errors["rules"] = str(e)
            return pd.DataFrame()


@dataclass
class Pair:
    """Two sources compared: `b` against the reference `a`; `pairs`: kernels paired by
    hand (A=B, as `--pair` gives them)."""

    a: Any
    b: Any
    index: int
    pairs: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        return f"c{self.index}"

    @property
    def label(self) -> str:
        return f"{self.b.label} vs {self.a.label}"

    @property
    def same(self) -> bool:
        """A source compared with itself (--pair within one run): only the pairs asked for."""
        return self.a is self.b

    def kernel_pairs(self) -> analyze.KernelPairs:
        """The two sides' kernels paired as `compare` pairs them: --pair selectors on the
        launches, then a run's launches averaged per variant, dataset and function. The
        page's answer and its comparison panels both count from this one pairing."""
        return analyze.pair_kernels(side_kernels(self.a), side_kernels(self.b), self.pairs,
                                    auto=not (self.same and self.pairs), where=(self.a.label, self.b.label))


def side_kernels(src: Any) -> pd.DataFrame:
    """A side's kernels, one row per launch; a run's per table (analyze.per_table_kernels), and
    so a report's whose run's points sit beside it (ImportSource.kview_per_table)."""
    if isinstance(src, RunSource):
        return analyze.per_table_kernels(src.kview, src.run)
    return src.kview_per_table.assign(per="table") if src.per_table else src.kview


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


