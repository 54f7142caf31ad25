"""The page's layout: panels as cards in a grid of two columns on a wide screen, a wide
panel (figures side by side, a figure drawn for the whole row, a table with many columns
shown unfolded) across the row, a narrow panel alone in its row with its figure beside
the rest, a tall one beside two short ones; one line of provenance per panel and section;
and on the H200 run, every figure and table of every panel on the page (nothing dropped),
and in a browser at 1,280 px a page about two thirds the height of the stacked one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from characterize.report.blocks import Cell, DetailsBlock, FigureBlock, FigureRow, NoteBlock, TableBlock
from characterize.report.render import WIDE_FIGURE_PX, RenderedPanel, _place, build_report, is_wide, report_html
from tests.report.browser import Browser, chromium_path
from tests.report.test_report import panel_html

H200 = Path(__file__).resolve().parents[2] / "profiles" / "h200"
RUNS = [H200 / "paper-gpu", H200 / "paper-gpu-profile"]


def _fig(width: int = 800) -> FigureBlock:
    return FigureBlock("f", "data:image/png;base64,", width, 340, "f", "")


def _table(columns: int, rows: int = 3) -> TableBlock:
    return TableBlock([f"c{i}" for i in range(columns)], [[Cell("x")] * columns] * rows)


def _panel(pid: str, *blocks: Any) -> RenderedPanel:
    rp = RenderedPanel(pid, pid, "", [], [], "", list(blocks))
    rp.wide = is_wide(rp.blocks)
    return rp


# ------------------------------------------------------------------ the rules
def test_what_makes_a_panel_wide():
    assert is_wide([FigureRow([_fig(), _fig()])])
    assert is_wide([_fig(WIDE_FIGURE_PX + 150)])            # the memory chart, the warp-stall chart
    assert is_wide([_table(7)])                              # too many columns for half a row
    assert not is_wide([_fig(), _table(6), NoteBlock("n")])
    assert not is_wide([_fig(), DetailsBlock("The numbers", [_table(12)])])   # folded: opening it widens it


def test_a_narrow_panel_alone_in_its_row_puts_its_figure_beside_the_rest():
    panels = [_panel("a", NoteBlock("n"), _fig(), DetailsBlock("t", [_table(9)])),
              _panel("b", FigureRow([_fig(), _fig()])),
              _panel("c", _fig()), _panel("d", _fig()),
              _panel("e", _table(3))]
    _place(panels)
    a, b, c, d, e = panels
    assert a.solo and a.wide and a.solo_at == 1
    assert b.wide and not b.solo
    assert not (c.solo or d.solo or c.wide or d.wide)        # a pair shares the row
    assert not e.solo and not e.wide                         # no figure: stays in half a row


def test_a_panel_with_a_figure_spans_two_rows_beside_two_short_ones():
    panels = [_panel("head", _fig(), NoteBlock("n")), _panel("holds", _table(4)), _panel("env", NoteBlock("e"))]
    _place(panels)
    assert panels[0].tall and not any(p.tall or p.solo for p in panels[1:])


# ---------------------------------------------------------- the H200 report
@pytest.fixture(scope="module")
def h200() -> tuple[dict, str]:
    ctx = build_report(RUNS, strict=True)
    return ctx, report_html(RUNS, strict=True)


def _count(blocks: list[Any], kind: type) -> int:
    n = 0
    for b in blocks:
        n += isinstance(b, kind)
        if isinstance(b, FigureRow):
            n += _count(b.figures, kind)
        elif isinstance(b, DetailsBlock):
            n += _count(b.blocks, kind)
    return n


def test_every_panel_sits_in_a_grid_and_nothing_is_dropped(h200):
    ctx, page = h200
    panels = [p for src in ctx["sources"] for sec in src.sections for p in sec.panels]
    for sec in re.split(r"<section id=", page)[1:]:
        body = sec.split("</section>")[0]
        ids = re.findall(r'<div class="panel[^"]*" id="([^"]+)"', body)
        assert ids and '<div class="panel-grid">' in body.split(f'id="{ids[0]}"')[0], ids
    for p in panels:
        part = panel_html(page, p.id)
        assert part.count("<img ") == _count(p.blocks, FigureBlock), p.id
        assert part.count("<table") == _count(p.blocks, TableBlock), p.id
        assert part.count('class="note') >= _count(p.blocks, NoteBlock), p.id
        assert f"How obtained:</span> {p.how}" in part.replace("&#39;", "'"), p.id


def test_the_h200_panels_share_rows_where_they_fit(h200):
    ctx, page = h200
    by_id = {p.id: p for src in ctx["sources"] for sec in src.sections for p in sec.panels}
    for pid in ("s1-sol", "s1-roofline", "s1-static", "s1-sweep", "s1-predicted-vs-measured", "s1-trust"):
        assert not by_id[pid].wide, pid                      # two per row
    for pid in ("s1-memory", "s1-stalls", "s1-speedup", "s1-vs-base", "s1-rules", "s1-locality"):
        assert by_id[pid].wide, pid
    assert by_id["s1-latency"].solo and by_id["s1-occupancy"].solo and by_id["s1-why"].solo
    assert by_id["s1-headline"].tall
    assert 'class="panel wide solo" id="s1-latency"' in page and 'class="panel tall" id="s1-headline"' in page
    # provenance: one folded line per panel and per section
    assert page.count('<details class="how">') == len(by_id)
    assert page.count('<details class="how sec-prov">') == sum(
        1 for src in ctx["sources"] for sec in src.sections if sec.provenance or sec.modes)


# ------------------------------------------------------------ in a browser
MEASURE = """(() => {
  const box = id => { const r = document.getElementById(id).getBoundingClientRect();
                      return {top: r.top + scrollY, left: r.left, width: r.width, height: r.height}; };
  const grid = document.querySelector('.panel-grid').getBoundingClientRect();
  return {height: document.documentElement.scrollHeight, scrollWidth: document.documentElement.scrollWidth,
          inner: innerWidth, grid: grid.width, sol: box('s1-sol'), roofline: box('s1-roofline'),
          memory: box('s1-memory'), latency: box('s1-latency'),
          empty: [...document.querySelectorAll('div.panel')].filter(p => p.getBoundingClientRect().height < 40)
                   .map(p => p.id),
          sideways: [...document.querySelectorAll('.table-wrap')]
                   .filter(w => !w.closest('details:not([open])') && w.scrollWidth > w.clientWidth + 1)
                   .map(w => (w.closest('.panel, section') || {id: '?'}).id)};
})()"""
OPEN_FOLD = """(() => { document.querySelector('#s1-sol > details.fold').open = true;
  const r = document.getElementById('s1-sol').getBoundingClientRect();
  return r.width; })()"""


@pytest.fixture(scope="module")
def chromium() -> str:
    path = chromium_path()
    if path is None:
        pytest.skip("headless Chromium not found (apt-get install -y chromium, or set CHARACTERIZE_CHROMIUM)")
    return path


@pytest.mark.slow
def test_the_h200_report_at_1280_px(chromium, h200, tmp_path):
    """The H200 report stacked every panel (18,196 px at 1,280 px); in the grid, panels that
    fit share a row, nothing is wider than the window, no panel is empty, no unfolded table
    hides a column behind a scroll bar, and opening a
    folded table in a half-width panel gives it the whole row. Below 1,000 px, one column."""
    html = tmp_path / "h200.html"
    html.write_text(h200[1])
    browser = Browser(chromium, tmp_path / "profile")
    try:
        wide = browser.evaluate(browser.open_page(html.resolve().as_uri(), width=1280), MEASURE)
        session = browser.open_page(html.resolve().as_uri(), width=1280)
        opened = browser.evaluate(session, OPEN_FOLD)
        narrow = browser.evaluate(browser.open_page(html.resolve().as_uri(), width=900), MEASURE)
        problems = browser.problems()
    finally:
        browser.close()
    assert problems == []
    assert wide["height"] < 12800, wide["height"]
    assert wide["scrollWidth"] <= wide["inner"] and narrow["scrollWidth"] <= narrow["inner"]
    assert wide["empty"] == [] and narrow["empty"] == []
    assert wide["sideways"] == []   # no table shown unfolded hides a column (the rule matrix's last point)
    sol, roof = wide["sol"], wide["roofline"]
    assert sol["top"] == roof["top"] and sol["left"] < roof["left"], (sol, roof)
    assert sol["width"] < 0.55 * wide["grid"] and wide["memory"]["width"] > 0.95 * wide["grid"]
    assert wide["latency"]["width"] > 0.95 * wide["grid"]             # alone in its row: the row is its
    assert opened > 0.95 * wide["grid"]
    assert narrow["sol"]["width"] > 0.95 * narrow["grid"] and narrow["sol"]["top"] < narrow["roofline"]["top"]
