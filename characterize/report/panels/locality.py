"""Report stage, panels of a stored run's workload locality: what each dataset's trace offers a cache.
"""

from __future__ import annotations

from typing import Any

from characterize.hardware.specs import DEFAULT_GPU
from characterize.report.blocks import (
    Cell,
    PanelOutput,
    column_cell,
    figure_block,
    fmt_num,
    fmt_pct,
    is_na,
    kv_table,
    table_block,
)
from characterize.report.layout import (
    S_LOCALITY,
    Panel,
)
from characterize.report.plots import (
    coverage_figure,
    order_datasets,
    reuse_figure,
)
from characterize.report.sources import RunSource
from characterize.units import format_bytes
from characterize.workloads.locality import PAPER_HOT_ROWS, named_ks


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
            ("lookups", column_cell("lookups")),
            ("unique rows", lambda r: Cell(fmt_num(r.get("unique_rows")) + (
                f" ({100 * r['unique_rows'] / r['rows']:.1f}% of {fmt_num(r['rows'])})" if r.get("rows") else ""),
                "num")),
            ("first reads", lambda r: Cell(fmt_pct(100 * r["cold_fraction"]) if not is_na(r.get("cold_fraction"))
                                           else "–", "num"))]
    spec += [(f"top-{k:,} coverage", (lambda k: lambda r: Cell(fmt_pct(100 * r[f"top_{k}"])
                                                                if not is_na(r.get(f"top_{k}")) else "–", "num"))(k))
             for k in ks]
    spec += [(f"reuse {q}", column_cell(f"q_{q}")) for q in qs]
    spec += [("bytes touched", column_cell("bytes_touched", format_bytes))]
    blocks: list[Any] = [table_block(rows, spec, caption="One table of each dataset (tables share a distribution)",
                                     note="reuse distance: distinct rows read between two reads of the same row; "
                                          "top-K coverage: fraction of lookups that hit the K most frequent rows")]
    descs = [(ds, raw[ds].get("description")) for ds in names if raw[ds].get("description")]
    if descs:
        blocks.append(kv_table(descs, caption="Dataset definitions"))
    row_bytes = next((d.get("row_bytes") for d in raw.values() if d.get("row_bytes")), None)
    ks = sorted({int(k) for d in raw.values() for k in (d.get("top_k_coverage") or {})})
    blocks.append(figure_block(coverage_figure(raw, _l2_marks(s, row_bytes), "Top-K coverage per dataset"),
                               "Top-K coverage", "markers: the K values locality.json stores (" +
                               ", ".join(f"{k:,}" for k in ks) + ") and K = unique rows (100%, exact); vertical "
                               "lines: rows of this size that fill each target GPU's L2. Coverage below the "
                               "smallest stored K is not stored, so it is not drawn"))
    if any(d.get("reuse_histogram") for d in raw.values()):
        blocks.append(figure_block(reuse_figure(raw, "Reuse-distance distribution"), "Reuse-distance distribution",
                                   "log2 bins; first reads (no earlier read) in the legend"))
    return PanelOutput(blocks)


PANELS: tuple[Panel, ...] = (
    Panel("locality", "Trace locality per dataset", S_LOCALITY, ("locality",), ("trace",),
          "unique rows, top-K coverage and reuse distances of one table's index stream per dataset "
          "(locality.json, exact reuse distances)", _p_locality),
)
