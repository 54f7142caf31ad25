"""Report stage, rendering: sources -> rendered sections -> one self-contained HTML page.

    render_report(["runs/paper-a100-80gb"], "reports/paper-a100.html")
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from characterize import __version__
from characterize.errors import ReportError
from characterize.report.blocks import Missing
from characterize.report.layout import NEEDS, Panel
from characterize.report.panels.compare import COMPARE_PANELS
from characterize.report.panels.imports import IMPORT_PANELS
from characterize.report.panels.run import RUN_PANELS
from characterize.report.provenance import PROVENANCE, Provenance
from characterize.report.sources import Pair, RunSource, open_source
from characterize.store import write_atomic

TEMPLATES = Path(__file__).parent / "templates"
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
