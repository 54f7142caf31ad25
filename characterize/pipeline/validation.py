"""Pipeline, validation: the model against the corpus of measurements, the public ones and our
own runs (analysis.validation scores them).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import pandas as pd

from characterize.analysis.model.constants import ModelConstants
from characterize.analysis.model.geometry import prepare_points as _prepare_points
from characterize.analysis.model.validation_error import write_model_error
from characterize.analysis.validation import (
    VALIDATION_CSV,
    VALIDATION_HERE_CSV,
    Validation,
    expressible,
    load_measurements,
    not_expressible,
    validate_here,
    validate_points,
)
from characterize.errors import (
    CharacterizeError,
)
from characterize.hardware.specs import gpu_spec
from characterize.kernels.build import buildable_arch
from characterize.kernels.registry import (
    get_variant,
)
from characterize.pipeline.facts import CodeFacts, code_facts
from characterize.progress import Progress, Reporter, as_reporter


def measured_points(rows: Sequence[Any], progress: Reporter | Progress | None = None
                    ) -> tuple[list[Any], list[Any], list[dict[str, str]]]:
    """The model's prepared point of each corpus row (analysis.validation.Measurement): the
    rows it could prepare, their points, and the rows it could not, with why. Code facts and
    trace profiles are shared by the rows that have the same."""
    rep = as_reporter(progress)
    facts: dict[tuple, CodeFacts] = {}
    profiles: dict[tuple, Any] = {}
    points, kept, left = [], [], []
    with rep.task("predicting the measurements", total=len(rows), unit="rows") as task:
        for m in rows:
            task.advance(0, item=f"{m.id} {m.variant} on {m.gpu}")
            try:
                gpu = gpu_spec(m.gpu)
                v = get_variant(m.variant)
                static = sass = None
                if v.compiled or v.host != "none":   # a host-resident table is gathered by base's kernel
                    arch = buildable_arch(gpu.arch)
                    names = [m.variant] if v.host == "none" else ["base"]
                    key = (*names, arch, m.workload.D, m.workload.dtype, json.dumps(m.params, sort_keys=True))
                    if key not in facts:
                        facts[key] = code_facts(names, [arch], m.workload.D, m.params, dtype=m.workload.dtype)
                    static, sass = facts[key].static, facts[key].sass
                pts = _prepare_points(m.workload, [m.dataset], [m.variant], [gpu], m.params, static, sass, 1, m.mode,
                                      profiles, None, set_aside=m.set_aside, with_base=False)
                points.append(next(p for p in pts if p.variant == m.variant))
                kept.append(m)
            except CharacterizeError as e:
                left.append({"id": m.id, "source": m.source, "gpu": m.gpu, "kernel": m.variant,
                             "why_not": f"not predictable here: {e}"})
            task.advance(1)
        task.finish(f"{len(kept)} of {len(rows)} expressible row(s) predicted")
    return kept, points, left


def validate(*, write: bool = False, progress: Reporter | Progress | None = None) -> Validation:
    """The model against the corpus (analysis.validation): each expressible row predicted
    from the code facts of its kernel (ours compiled here, the peers' from their SASS). The
    public measurements are scored with the published constants and under leave-one-source-
    out cross-validation; our own measured runs (measured_here.csv) under leave-one-dataset-
    out and leave-one-shape-out, with bands per regime from held-out residuals. `write`
    stores the figures and bands every later prediction carries (model_error.json) and the
    per-row results."""
    rep = as_reporter(progress)
    corpus = load_measurements()
    kept, points, left = measured_points(expressible(corpus), rep)
    public = [i for i, m in enumerate(kept) if m.origin != "here"]
    ours = [i for i, m in enumerate(kept) if m.origin == "here"]
    consts = {p.gpu.key: ModelConstants.defaults(p.gpu) for p in points}   # published: no machine's calibration
    with rep.task("leave-one-source-out cross-validation") as task:
        result = validate_points([kept[i] for i in public], [points[i] for i in public], consts)
        task.finish(f"{result.error.n} measurements, {result.error.sources} sources")
    if ours:
        with rep.task("our runs: leave-one-dataset-out and leave-one-shape-out") as task:
            here = validate_here([kept[i] for i in ours], [points[i] for i in ours], consts)
            task.finish(f"{len(ours)} points, {len(here.bands)} regimes")
        result.here = here
        overall = here.by["source"].set_index("source").loc["all"]
        result.error = dataclasses.replace(
            result.error, here={"n": int(overall["n"]), "gmae": float(overall["gmae"]), "mape": float(overall["mape"]),
                                "coverage": float(overall["inside_band"]), "cv": "leave-one-dataset-out"},
            regimes={r: [round(a, 4), round(b, 4), n] for r, (a, b, n) in here.bands.items()})
    result.left_out = pd.concat([not_expressible(corpus), pd.DataFrame(left)], ignore_index=True)
    if write:
        write_model_error(result.error)
        result.rows.to_csv(VALIDATION_CSV, index=False)
        if result.here is not None:
            result.here.rows.to_csv(VALIDATION_HERE_CSV, index=False)
    return result

