"""Report stage, layout: panels declared as data (section, needs, provenance, builder)
and what each needs from a source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from characterize.analysis import ncu
from characterize.report.blocks import PanelOutput
from characterize.report.sources import Pair, RunSource


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


def points_missing(src: RunSource, kind: str, hint: str) -> str:
    """Why a run has no usable `kind` points, for the reader, with `hint` saying how to measure them."""
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


BENCH_HINT = ("Time the kernels on a GPU with `characterize bench EXPERIMENT --out RUN_DIR --resume` "
              "(`--backend emulate` checks the harness on the CPU).")
PROFILE_HINT = "Profile on a GPU with `characterize profile EXPERIMENT --out RUN_DIR --resume`."


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
    return points_missing(s, "bench", BENCH_HINT) if isinstance(s, RunSource) else \
        "an imported ncu report holds no CUDA-event timings"


def _has_metrics(s: Any) -> bool:
    return not s.metrics.empty


def _metrics_why(s: Any) -> str:
    return points_missing(s, "profile", PROFILE_HINT) if isinstance(s, RunSource) else "the report holds no metrics"


NEEDS: dict[str, Need] = {n.name: n for n in (
    Need("meta", "meta.json of the run", lambda s: bool(s.meta), lambda s: "meta.json holds nothing"),
    Need("locality", "trace locality statistics (locality.json)", lambda s: bool(s.locality_raw),
         lambda s: s.errors.get("locality") or (
             f"the locality step was {_step(s, 'locality')}" if _step(s, "locality") else
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
    Need("e2e", "the DLRM step around each variant (e2e.csv)", lambda s: not s.run.e2e.empty,
         lambda s: "no e2e.csv in the run directory: `characterize run` writes it (and `characterize e2e` prints "
                   "it)"),
    Need("kernels", "per-kernel metrics of the report", lambda s: not s.kernels.empty,
         lambda s: "the report holds no kernels"),
    Need("sol", "speed-of-light metrics (SpeedOfLight section)",
         lambda s: _any(s.kview, ("sm_throughput_pct", "memory_throughput_pct")),
         lambda s: "no kernel has SM or memory throughput metrics: the SpeedOfLight section was not collected "
                   "(profile with --section SpeedOfLight or the default set)"),
    Need("memory", "memory-workload metrics (MemoryWorkloadAnalysis section)",
         lambda s: _any(s.kview, ("l1_load_sectors", "l2_read_sectors", "dram_bytes_read", "l1_hit_rate_raw_pct",
                                  "l2_hit_rate_raw_pct")),
         lambda s: "no kernel has L1/L2 sector, hit-rate or DRAM byte metrics: the MemoryWorkloadAnalysis "
                   "sections were not collected"),
    Need("roofline", "ncu's roofline counters (SpeedOfLight_RooflineChart section)",
         lambda s: ncu.has_roofline(s.kview),
         lambda s: "the report carries none of ncu's roofline counters with floating-point work in them (the "
                   "SpeedOfLight_RooflineChart section was not collected, or no kernel executed FP instructions)"),
    Need("bandwidth", "DRAM or L2 bytes and their peaks (SpeedOfLight, MemoryWorkloadAnalysis sections)",
         lambda s: ncu.has_bandwidth(s.kview),
         lambda s: "no kernel has DRAM or L2 bytes with a peak to set them against (dram__bytes / lts__t_bytes and "
                   "gpu__dram_throughput or the peak counters: the SpeedOfLight and MemoryWorkloadAnalysis sections "
                   "were not collected)"),
    Need("stalls", "warp-stall metrics (WarpStateStats section)",
         lambda s: any(c.startswith("stall_") and s.kview[c].notna().any() for c in s.kview.columns),
         lambda s: "the report has no warp-stall metrics (the WarpStateStats section was not collected)"),
    Need("sass", "the SASS hot-loop table (sass.csv)", lambda s: not s.sass.empty,
         lambda s: s.errors.get("sass") or (f"the sass step was {_step(s, 'sass')}" if _step(s, "sass") else
                                            "no sass.csv in the run directory: the SASS step (cuobjdump on the built "
                                            "kernels) has not run for this run; it needs NVIDIA's disassembler "
                                            "(`pip install 'characterize[sass]'` or a CUDA toolkit)")),
    Need("runs", "two stored runs", lambda s: isinstance(s.a, RunSource) and isinstance(s.b, RunSource),
         lambda s: f"{(s.b if isinstance(s.a, RunSource) else s.a).label} is an imported report, not a run"),
    Need("static-both", "static.csv in both runs", lambda s: not s.a.static.empty and not s.b.static.empty,
         lambda s: f"{(s.a if s.a.static.empty else s.b).label} has no static characterization"),
    Need("predictions-both", "predictions.csv in both runs",
         lambda s: not s.a.predictions.empty and not s.b.predictions.empty,
         lambda s: f"{(s.a if s.a.predictions.empty else s.b).label} has no predictions.csv"),
    Need("sass-both", "sass.csv in both runs", lambda s: not s.a.sass.empty and not s.b.sass.empty,
         lambda s: f"{(s.a if s.a.sass.empty else s.b).label}: " + NEEDS["sass"].why_missing(
             s.a if s.a.sass.empty else s.b)),
    Need("kview-both", "per-kernel Nsight Compute metrics on both sides",
         lambda s: not s.a.kview.empty and not s.b.kview.empty,
         lambda s: f"{(s.a if s.a.kview.empty else s.b).label}: " + (
             _metrics_why(s.a if s.a.kview.empty else s.b))),
)}


def _any(k: Any, cols: tuple[str, ...]) -> bool:
    return k is not None and not k.empty and any(c in k.columns and k[c].notna().any() for c in cols)


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
    applies: Callable[[Any], bool] | None = None   # None: always; False for a source: the panel is left out


def never_measured(src: Any, need: str) -> bool:
    """Whether `need` (bench or profile) is missing only because nothing was ever measured:
    no points of that kind at all (none failed, nothing unreadable). Such panels are listed
    once, in the report's "needs a GPU" box, instead of one missing box each."""
    if need not in ("bench", "profile"):
        return False
    if isinstance(src, Pair):
        return never_measured(src.a, need) or never_measured(src.b, need)
    if not isinstance(src, RunSource):
        return False
    points = src.bench_points if need == "bench" else src.profile_points
    return not points and not src.errors.get(need)


def experiment_of(src: Any) -> dict:
    """The experiment a run recorded in meta.json ({} for other sources)."""
    return (src.meta.get("experiment") or {}) if isinstance(src, RunSource) else {}


def asked_for(src: Any, variants: tuple[str, ...]) -> bool:
    """Whether the run's experiment names any of `variants` (panels about them appear only then)."""
    return bool(set(experiment_of(src).get("variants") or ()) & set(variants))


PAPER_EXPERIMENT = "paper"


def is_paper(src: Any) -> bool:
    """Whether a run is the paper's configuration, the only one its published claims are about."""
    exp = experiment_of(src)
    wl = exp.get("workload") or {}
    return exp.get("name") == PAPER_EXPERIMENT or (
        (wl.get("T"), wl.get("E"), wl.get("D"), wl.get("B"), str(wl.get("L"))) == (12, 500000, 128, 2048, "150")
        and wl.get("dtype", "fp32") == "fp32")


def gpu_command(src: Any) -> str:
    """The command that measures what a run lacks, on a machine with a GPU."""
    exp = experiment_of(src).get("name") or "EXPERIMENT"
    shipped = exp in ("paper", "quick", "selftest")
    where = f" --out {src.run.path}" if isinstance(src, RunSource) else ""
    return f"characterize run {exp if shipped else exp + '.toml'}{where} --resume"


def timing_provenances(s: Any) -> tuple[str, ...]:
    """The timing provenances of a source, or of both sides of a Pair (each once, in order)."""
    if isinstance(s, Pair):
        return tuple(dict.fromkeys(timing_provenances(s.a) + timing_provenances(s.b)))
    return (s.timing_provenance,) if isinstance(s, RunSource) else ()


# --------------------------------------------------------------- the panel lists
S_OVERVIEW, S_LOCALITY, S_STATIC, S_TIMING = "Overview", "Workload locality", "Static characterization", "Timing"
S_NCU, S_RULES, S_MODEL, S_FAIL = "Microarchitecture (Nsight Compute)", "Nsight Compute rule findings", \
    "Model predictions", "Failures"
S_SOL, S_MEM, S_STALLS = "Speed of light and roofline (Nsight Compute)", "Memory workload (Nsight Compute)", \
    "Warp stalls and occupancy (Nsight Compute)"
S_COMPARE = "Comparison"

