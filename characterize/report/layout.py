"""Report stage, layout: panels declared as data (section, needs, provenance, builder)
and what each needs from a source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

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


# --------------------------------------------------------------- the panel lists
S_OVERVIEW, S_LOCALITY, S_STATIC, S_TIMING = "Overview", "Workload locality", "Static characterization", "Timing"
S_NCU, S_RULES, S_MODEL, S_FAIL = "Microarchitecture (Nsight Compute)", "Nsight Compute rule findings", \
    "Model predictions", "Failures"

