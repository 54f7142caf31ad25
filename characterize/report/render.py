"""Report stage, rendering: sources -> rendered sections -> one self-contained HTML page.

    render_report(["runs/paper-a100-80gb"], "reports/paper-a100.html")
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import matplotlib

from characterize import __version__
from characterize.analysis.answer import ModelValidation
from characterize.analysis.compare import check_pairs
from characterize.errors import CharacterizeError, ReportError
from characterize.files import check_output, write_atomic
from characterize.report.blocks import Cell, Missing, NoteBlock, TableBlock, compact
from characterize.report.headline import answer_boxes
from characterize.report.layout import NEEDS, Panel, gpu_command, never_measured
from characterize.report.panels.catalog import COMPARE_PANELS, IMPORT_PANELS, IMPORT_TABLE_PANELS, RUN_PANELS
from characterize.report.provenance import PROVENANCE, Provenance
from characterize.report.sources import Pair, RunSource, open_source
from characterize.store import MergedRun, Run, complementary, load_run

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
    inherits: bool = False  # provenance and modes are the section's (said once there)
    same_missing: bool = False  # missing for the reason the panel above gave
    needs_gpu: bool = False  # missing only because nothing was measured: listed in the "needs a GPU" box
    section: str = ""
    collapsed: str = ""  # the summary of a panel shown collapsed (the "needs a GPU" box)
    wide: bool = False  # takes the whole row of the panel grid (see is_wide); else half of it on a wide screen
    solo: bool = False  # a narrow panel alone in its row: its figure (blocks[solo_at]) beside the rest (_place)
    solo_at: int = 0
    tall: bool = False  # a narrow panel with a figure beside two short ones stacked in the other half (_place)


@dataclass
class RenderedSection:
    id: str
    title: str
    panels: list[RenderedPanel]
    provenance: list[Provenance] = field(default_factory=list)
    modes: str = ""


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
    try:   # a damaged file of a run costs the panels that need it, not the report
        for name in panel.needs:
            need = NEEDS[name]
            if not need.present(src):
                rp.missing = need.why_missing(src)
                rp.missing_need = True
                rp.needs_gpu = never_measured(src, name)
                return rp
    except CharacterizeError as e:
        if strict:
            raise
        rp.missing = f"could not be read: {e}"
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
    rp.blocks = compact(out.blocks)
    rp.wide = is_wide(rp.blocks)
    rp.modes = out.modes
    if out.provenance is not None:
        rp.provenance = [PROVENANCE[k] for k in out.provenance]
    return rp


#: a figure drawn wider than this (the memory chart, the stall chart) needs the whole row
WIDE_FIGURE_PX = 850
#: a table shown unfolded with more columns than this needs the whole row
WIDE_TABLE_COLUMNS = 6


def is_wide(blocks: Sequence[Any]) -> bool:
    """Whether a panel needs the grid's whole row: figures side by side, a figure drawn wider
    than the others, or a table with many columns shown unfolded. Why: two narrow panels
    side by side halve the page's height where a figure of 800 px is readable at half
    width; what would be squeezed (or scroll sideways) keeps the full width. A folded table
    does not count: opening it widens its panel (report.css)."""
    for b in blocks:
        kind = getattr(b, "kind", "")
        if kind == "figrow" or (kind == "figure" and b.width > WIDE_FIGURE_PX):
            return True
        if kind == "table" and len(b.columns) > WIDE_TABLE_COLUMNS:
            return True
    return False


def _sections(panels: Sequence[Panel], src: Any, strict: bool) -> list[RenderedSection]:
    """The source's sections: panels that do not apply to it left out, panels that only a
    GPU run would fill gathered into one collapsed box (in the first section), sections
    left without panels dropped."""
    out: dict[str, RenderedSection] = {}
    folded: list[RenderedPanel] = []
    for p in panels:
        if p.applies is not None and not _applies(p, src, strict):
            continue
        sec = out.setdefault(p.section, RenderedSection(f"{src.slug}-sec-{_slug(p.section)}", p.section, []))
        rp = _render_panel(p, src, strict)
        rp.section = p.section
        (folded if rp.needs_gpu else sec.panels).append(rp)
    if folded:
        first = next(iter(out.values()))
        first.panels.insert(min(len(first.panels), 1), _gpu_box(folded, src))
    for sec in out.values():
        _hoist_provenance(sec)
        _place(sec.panels)
    return [sec for sec in out.values() if sec.panels]


def _figure_at(p: RenderedPanel) -> int | None:
    """Where a built panel's first figure is among its blocks (None: it shows none)."""
    if p.missing or p.error or p.collapsed:
        return None
    return next((j for j, b in enumerate(p.blocks) if getattr(b, "kind", "") in ("figure", "figrow")), None)


def _place(panels: list[RenderedPanel]) -> None:
    """Walk the grid's rows as a wide screen lays them out, so that no half row stays
    empty beside a long panel: a narrow panel with a figure followed by two narrow ones
    without spans two rows, the two stacked beside it (tall); a narrow panel with a figure
    that would sit alone in its row (the next panel is wide, or there is none) takes the
    row, its figure on the left and the rest on the right (solo)."""
    narrow = [not (p.wide or p.collapsed) for p in panels]
    i, n = 0, len(panels)
    while i < n:
        p = panels[i]
        if not narrow[i]:
            i += 1
            continue
        if (i + 2 < n and narrow[i + 1] and narrow[i + 2] and _figure_at(p) is not None
                and _figure_at(panels[i + 1]) is None and _figure_at(panels[i + 2]) is None):
            p.tall = True
            i += 3
            continue
        if i + 1 < n and narrow[i + 1]:
            i += 2
            continue
        at = _figure_at(p)
        if at is not None and p.blocks[at].kind == "figure":
            p.wide, p.solo, p.solo_at = True, True, at
        i += 1


def _applies(panel: Panel, src: Any, strict: bool) -> bool:
    try:
        return bool(panel.applies(src))
    except Exception:  # noqa: BLE001 - when it cannot be told, the panel is shown (and says what it lacks)
        if strict:
            raise
        return True


def _gpu_box(folded: list[RenderedPanel], src: Any) -> RenderedPanel:
    """One collapsed box for every panel that only a GPU run fills: what each would show,
    why it is empty, and the command that fills it."""
    sections = list(dict.fromkeys(p.section.split(" (")[0].lower() for p in folded))
    reasons = list(dict.fromkeys(p.missing for p in folded if p.missing))
    rows = [[Cell(p.section), Cell(p.title), Cell(p.how)] for p in folded]
    blocks: list[Any] = [
        NoteBlock(f"Run on a machine with a GPU: `{gpu_command(src)}` (finished steps are kept). Why these are "
                  "empty here: " + " ".join(reasons)),
        TableBlock(["section", "panel", "what it would show"], rows)]
    rp = RenderedPanel(f"{src.slug}-needs-gpu", f"Needs a GPU: {len(folded)} panels of measurements",
                       "what a GPU run would add to this report", [], [PROVENANCE["meta"]], "", blocks, wide=True)
    rp.collapsed = (f"Needs a GPU: {len(folded)} more panels of measurements ({', '.join(sections)}); "
                    f"`{gpu_command(src)}` on a GPU machine adds them")
    return rp


def _hoist_provenance(sec: RenderedSection) -> None:
    """Say provenance and collection modes once per section when every panel with data
    shares them; a panel that differs keeps its own."""
    for prev, p in zip(sec.panels, sec.panels[1:]):
        p.same_missing = bool(p.missing and p.missing == prev.missing)
    shown = [p for p in sec.panels if not p.collapsed]
    built = [p for p in shown if not p.missing and not p.error] or \
        [p for p in shown if not p.error]  # a section with nothing measured still says its source once
    if not built:
        return
    keys = {(tuple(pv.key for pv in p.provenance), p.modes) for p in built}
    if len(keys) != 1:
        return
    sec.provenance, sec.modes = list(built[0].provenance), built[0].modes
    for p in sec.panels:
        if [pv.key for pv in p.provenance] == [pv.key for pv in sec.provenance] and (p.modes in ("", sec.modes)):
            p.inherits = True


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


#: comparison panels that only make sense between two stored runs
RUN_ONLY_COMPARE = ("bench", "static", "predictions", "sass")


def build_report(sources: Any, *, title: str | None = None, strict: bool = False,
                 compare: bool = True, pairs: Sequence[str] = (),
                 validation: ModelValidation | None = None) -> dict[str, Any]:
    """The template context of a report over `sources` (see render_report)."""
    items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
    if not items:
        raise ReportError("nothing to report: give at least one run directory or report file")
    srcs = [open_source(s, i) for i, s in enumerate(merged(items), 1)]
    _distinct_labels(srcs)
    if pairs and compare:   # a --pair that names no kernel or timed point is said, not ignored
        def held(src: Any) -> list[Any]:
            return [src.kview, *([src.bench_ok] if isinstance(src, RunSource) else [])]
        rest = srcs[1:] or srcs[:1]
        check_pairs(pairs, held(srcs[0]), [f for s in rest for f in held(s)], srcs[0].label,
                    ", ".join(s.label for s in rest))
    rendered = []
    for src in srcs:
        panels = RUN_PANELS if src.kind == "run" else IMPORT_TABLE_PANELS if src.per_table else IMPORT_PANELS
        kind = "run" if src.kind == "run" else "Nsight Compute report"
        rendered.append(RenderedSource(src.slug, src.label, kind, _sections(panels, src, strict)))
    comparisons, pair_list = [], []
    # one source and --pair: the named kernels of that source against each other (only those)
    others = srcs[1:] if len(srcs) > 1 else srcs[:1] if pairs else []
    for i, other in enumerate(others if compare else [], 1):
        pair = Pair(srcs[0], other, i, tuple(pairs))
        pair_list.append(pair)
        both_runs = src_is_run(pair.a) and src_is_run(pair.b)
        itself = pair.a is pair.b   # only the --pair kernels and points: its static facts equal themselves
        panels = [p for p in COMPARE_PANELS
                  if p.id not in RUN_ONLY_COMPARE or (both_runs and not itself) or (itself and p.id == "bench")]
        comparisons.append(RenderedSource(pair.slug, pair.label, "comparison", _sections(panels, pair, strict)))
    used = sorted({p.key for r in rendered + comparisons for sec in r.sections for pn in sec.panels
                   for p in pn.provenance}, key=list(PROVENANCE).index)
    try:
        answers = answer_boxes(srcs, validation, pair_list)
    except Exception:  # noqa: BLE001 - the page without its first box beats no page
        if strict:
            raise
        answers = []
    return {
        "title": title or "characterize report: " + ", ".join(s.label for s in srcs),
        "answers": answers, "sources": rendered, "comparisons": comparisons, "provenance": [PROVENANCE[k] for k in used],
        "version": __version__, "matplotlib": matplotlib.__version__, "css": (TEMPLATES / "report.css").read_text(),
    }


def merged(items: Sequence[Any]) -> list[Any]:
    """The sources with the runs that complete each other merged into one run (store.
    complementary, MergedRun: a bench from one run, a profile of other points from another),
    where the first of them stood; report files and other runs as given."""
    out: list[Any] = []
    runs: list[tuple[int, Run]] = []
    for item in items:
        run = item if isinstance(item, Run) else load_run(item) if Path(item).is_dir() else None
        if run is None:
            out.append(item)
            continue
        home = next((i for i, r in runs if complementary(r.parts if isinstance(r, MergedRun) else [r], run)), None)
        if home is None:
            runs.append((len(out), run))
            out.append(run)
        else:
            first = out[home]
            parts = first.parts if isinstance(first, MergedRun) else [first]
            out[home] = MergedRun([*parts, run])
            runs = [(i, out[home] if i == home else r) for i, r in runs]
    return out


def _distinct_labels(srcs: list[Any]) -> None:
    """Two sources with one name (two copies of a run) are told apart by their directory
    or file name, else by their position, so comparison columns never share a header."""
    names = [s.label for s in srcs]
    for s in srcs:
        if names.count(s.label) > 1:
            where = s.run.path.name if isinstance(s, RunSource) else s.path.name
            s.label = where if where != s.label and [x.label for x in srcs].count(where) == 0 else \
                f"{s.label} [{s.index}]"


def src_is_run(s: Any) -> bool:
    return isinstance(s, RunSource)


def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def report_html(sources: Any, *, title: str | None = None, strict: bool = False, compare: bool = True,
                pairs: Sequence[str] = (), validation: ModelValidation | None = None) -> str:
    """The report as an HTML string (for notebooks: IPython.display.HTML(report_html(run)))."""
    import markupsafe

    ctx = build_report(sources, title=title, strict=strict, compare=compare, pairs=pairs, validation=validation)
    ctx["css"] = markupsafe.Markup(ctx["css"])  # our own stylesheet, never data
    return _environment().get_template("report.html").render(**ctx)


def render_report(sources: Any, output: str | Path, *, title: str | None = None, strict: bool = False,
                  compare: bool = True, pairs: Sequence[str] = (), validation: ModelValidation | None = None) -> Path:
    """Render one self-contained HTML report and return its path.

    sources: run directories or Run objects (full characterization report each) and
    ``.ncu-rep`` / ncu CSV files (generic per-kernel report each); a single source
    may be given bare. With two or more sources, each later one is also compared
    with the first (unmatched points and kernels are listed) unless compare=False;
    pairs: what to pair by hand in comparisons ("A=B": variants, variant/dataset, NVTX
    ranges, function or demangled names, #IDs; with one source, its own A against B).
    validation: the model's error on measurements it was not fitted to,
    stated in the first box (None: said to be not yet validated). strict=True raises the
    first error of a panel builder instead of showing it.
    """
    out = Path(output)
    if out.is_dir():
        out = out / "report.html"
    check_output(out, _inputs(sources))   # before any work: never over a device, a FIFO or an input
    write_atomic(out, report_html(sources, title=title, strict=strict, compare=compare, pairs=pairs,
                                  validation=validation), _inputs(sources))
    return out


def _inputs(sources: Any) -> list[Path]:
    """Every file the report reads: report files given, and the files of run directories
    (their report.html aside, which the report of a run replaces)."""
    out = []
    for src in sources if isinstance(sources, (list, tuple)) else [sources]:
        p = Path(getattr(src, "path", src)) if isinstance(src, (str, Path)) or hasattr(src, "path") else None
        if p is None:
            continue
        if p.is_dir():
            out += [f for f in p.rglob("*") if f.is_file() and f.name != "report.html"]
        else:
            out.append(p)
    return out
