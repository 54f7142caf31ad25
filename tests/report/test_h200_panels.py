"""The Nsight Compute panels on the H200's own measurements (profiles/h200): a batched kernel
per table beside per-table ones, stalls weighted one way and said so, ncu's estimates capped
by the speed of light, each memory level against its own peak, waves and DRAM bandwidth
shown, one byte convention, a readable pre-pass chart, and the notebook on both runs."""

from __future__ import annotations

import html as html_lib
import itertools
import re
from pathlib import Path

import pytest

from characterize.analysis import compare as analyze
from characterize.report import plots
from characterize.report.render import report_html
from characterize.store import load_run
from tests.report.test_report import images, is_missing, panel_html

H200 = Path(__file__).resolve().parents[2] / "profiles" / "h200"
RUNS = [H200 / "paper-gpu", H200 / "paper-gpu-profile"]
NCU_PANELS = ("sol", "roofline", "memory", "stalls", "occupancy", "kernels", "rules")


def _text(fragment: str) -> str:
    return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def tables(part: str) -> list[tuple[str, list[str], list[dict[str, str]]]]:
    """(caption, headers, rows as header -> cell text) of every table in some HTML."""
    out = []
    for t in re.findall(r"<table[^>]*>(.*?)</table>", part, re.S):
        cap = re.search(r"<caption>(.*?)</caption>", t, re.S)
        heads = [_text(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", t, re.S)]
        body = t.split("</thead>")[-1]
        rows = [dict(zip(heads, [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]))
                for r in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
        out.append((_text(cap.group(1)) if cap else "", heads, rows))
    return out


def table(part: str, caption: str) -> tuple[list[str], list[dict[str, str]]]:
    return next((h, r) for c, h, r in tables(part) if c.startswith(caption))


def row(rows: list[dict[str, str]], **match: str) -> dict[str, str]:
    return next(r for r in rows if all(r.get(k) == v for k, v in match.items()))


def words(part: str) -> str:
    """The text a reader sees in some HTML (no images, no markup)."""
    return _text(re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", part))


@pytest.fixture(scope="module")
def page() -> str:
    """The report of the H200 run: bench and profile runs of one experiment, read as one."""
    return report_html(RUNS, strict=True)


@pytest.fixture(scope="module")
def imported() -> str:
    """The H200's full-section probe report and tbe's own report, imported as files."""
    return report_html([H200 / "ncu-probe" / "full.ncu-rep", H200 / "paper-gpu" / "ncu" / "tbe.ncu-rep"],
                       strict=True, compare=False)


def test_every_nsight_panel_is_built(page):
    for pid in NCU_PANELS:
        assert f'id="s1-{pid}"' in page and not is_missing(page, f"s1-{pid}"), pid
    assert "could not be built" not in page


def test_a_batched_kernel_is_shown_per_table(page):
    """One tbe launch covers 12 tables: 484 us and 1.8 GiB per launch are 40 us and 150 MiB
    per table, beside base's 145 us and 133 MiB for its one table, and the columns say so."""
    heads, rows = table(panel_html(page, "s1-sol"), "Throughput as % of peak")
    assert "duration per table (µs, under ncu)" in heads and "tables / launch" in heads
    tbe, base = row(rows, variant="tbe", dataset="random"), row(rows, variant="base", dataset="random")
    assert tbe["tables / launch"] == "12" and tbe["duration per table (µs, under ncu)"] == "40.3"
    assert base["tables / launch"] == "1" and base["duration per table (µs, under ncu)"] == "145"
    assert "Batched launches divided by their tables: tbe · medium (12 tables)" in words(panel_html(page, "s1-sol"))
    heads, rows = table(panel_html(page, "s1-memory"), "Memory workload per point")
    assert {"DRAM read per table", "DRAM written per table", "duration per table (µs, under ncu)"} <= set(heads)
    assert row(rows, variant="tbe", dataset="random")["DRAM read per table"] == "149.7 MiB"
    assert row(rows, variant="base", dataset="random")["DRAM read per table"] == "132.7 MiB"
    heads, rows = table(panel_html(page, "s1-kernels"), "Every profiled kernel")
    assert {"duration per table (µs)", "DRAM read per table"} <= set(heads)
    tbe = row(rows, variant="tbe", dataset="random")
    assert tbe["duration per table (µs)"] == "40.3" and tbe["DRAM read per table"] == "149.7 MiB"
    assert "1.8 GiB" not in words(panel_html(page, "s1-kernels"))


def test_the_stall_table_names_each_point_and_the_weight_it_uses(page):
    """The reports lack smsp__inst_issued.sum: the chart, its caption and the table all say
    the stalls are weighted by the instructions executed, per table; every row is named
    and has its share, tbe's a small one per table."""
    part = panel_html(page, "s1-stalls")
    text = words(part)
    assert "x warp instructions executed" in text and "instructions issued (" not in text
    heads, rows = table(part, "Each point's stalls")
    share = "share of all stall cycles, weighted by instructions executed"
    assert heads[:3] == ["point", "duration per table (µs, under ncu)", share]
    assert len(rows) == 9 and all(r["point"] and r[share].endswith("%") for r in rows)
    pct = {r["point"]: float(r[share].rstrip("%")) for r in rows}
    assert pct["tbe · random"] < pct["base · random"] / 4 and sum(pct.values()) == pytest.approx(100, abs=0.2)


def test_rule_estimates_are_capped_by_the_speed_of_light(page):
    """ncu's 93% for tbe's long-scoreboard stalls, at 91% of the L2's peak, shows as 9%,
    marked, with ncu's figure on hover; base, latency-bound, keeps most of its estimate."""
    part = panel_html(page, "s1-rules")
    _, _, rows = next(t for t in tables(part) if "finding(s) x" in t[0])
    long_sb = row(rows, finding="Warp Stall: Long Scoreboard Stalls")
    assert long_sb["tbe · random"] == "opt 9% †" and long_sb["tbe · medium"] == "opt 10% †"
    assert long_sb["base · medium"] == "opt 69%" and long_sb["base · random"] == "opt 70% †"
    assert "capped from" in long_sb["largest est. speedup"]
    assert "ncu estimated 93%; capped at 9%: L2 at 91% of peak" in html_lib.unescape(part)
    assert "93%" not in " ".join(" ".join(r.values()) for r in rows)
    assert "† capped" in words(part) and "100/x - 1" in words(part)


def test_a_run_gets_the_bandwidth_roofline_instead_of_the_fp_one(page):
    """Each memory level's bytes against its own peak, the H200's measured copy beside
    DRAM's; no bar past its roof; the FP roofline is left out, and why."""
    part = panel_html(page, "s1-roofline")
    text = words(part)
    assert len(images(part)) == 1
    assert "dashed: the measured copy ceiling, 3.8 TiB/s" in text and "No FP roofline" in text
    heads, rows = table(part, "Bandwidth per memory level per point")
    assert heads[2:] == ["DRAM bytes/s", "DRAM % of its peak", "L2 bytes/s", "L2 % of its peak",
                         "DRAM % of copy ceiling"]
    tbe = row(rows, variant="tbe", dataset="random")
    assert tbe["DRAM bytes/s"] == "3.7 TiB/s" and tbe["DRAM % of its peak"] == "83.4%"
    assert tbe["DRAM % of copy ceiling"] == "95.3%" and tbe["L2 % of its peak"] == "39.4%"
    assert all(float(r[h].rstrip("%")) <= 100 for r in rows for h in heads if h.endswith("of its peak"))
    assert "Not drawn, no byte counts in the report: L1" in text


def test_an_imported_report_keeps_its_fp_roofline_and_stays_per_launch(imported):
    part = panel_html(imported, "s1-roofline")
    assert "FP roofline" in words(part) and "Bandwidth roofline" in words(part) and len(images(part)) == 2
    heads, _ = table(part, "Bandwidth per memory level per kernel")
    assert "L1 bytes/s" in heads   # the full section set counts L1 sectors
    for pid in ("sol", "memory", "kernels"):   # the probe has no run beside it: nothing says what a launch covered
        assert "per launch" in words(panel_html(imported, f"s1-{pid}")), pid


def test_a_lone_report_of_a_run_is_per_table(imported):
    """tbe's .ncu-rep of the H200 run, reported alone: the points beside it (paper-gpu/points/
    profile) say its launches cover the workload's 12 tables, so every panel and the answer
    give 40.3 us and 149.7 MiB per table, never the launch's 484 us and 1.8 GiB."""
    text = words(imported)
    assert "484" not in text and "1.8 GiB" not in text
    assert "The kernel that matters is #0 chz_tbe_kernel (1 of 2): 40.3 µs" in text
    assert "records no table count" not in text
    for pid in ("time", *NCU_PANELS):
        part = words(panel_html(imported, f"s2-{pid}"))
        assert "per launch" not in part.replace("tables per launch", ""), pid
    heads, rows = table(panel_html(imported, "s2-time"), "Kernels by time")
    assert {"duration per table (µs)", "DRAM read per table"} <= set(heads)
    assert rows[0]["duration per table (µs)"] == "40.3" and rows[0]["DRAM read per table"] == "149.7 MiB"
    heads, rows = table(panel_html(imported, "s2-kernels"), "One row per profiled kernel")
    assert rows[0]["duration per table (µs)"] == "40.3"
    heads, rows = table(panel_html(imported, "s2-memory"), "Memory workload per kernel")
    assert rows[0]["DRAM read per table"] == "149.7 MiB"


def test_two_lone_reports_of_a_run_compare_per_table():
    """base's and tbe's reports compared: both per table (145 us against 40.3 us), and the
    page keeps its first box when nothing pairs up by itself."""
    files = [H200 / "paper-gpu" / "ncu" / "base.ncu-rep", H200 / "paper-gpu" / "ncu" / "tbe.ncu-rep"]
    text = words(report_html(files, strict=True, pairs=["base/random=tbe/random"]))
    assert "145 µs → 40.3 µs (-72.1%)" in text and "484" not in text
    # the answer counts the kernels left alone as the comparison panel lists them (base's two
    # launches on random are one mean kernel, as are its two on medium)
    assert "2 kernel(s) are on one side only" in text and "Unmatched kernels (2)" in text
    text = words(report_html(files, strict=True))
    assert "No kernel of tbe.ncu-rep pairs up with one of base.ncu-rep (4 on one side only)" in text
    assert "Unmatched kernels (4)" in text


def test_waves_per_sm_and_dram_bandwidth_are_shown(page):
    heads, rows = table(panel_html(page, "s1-occupancy"), "Occupancy and launch per point")
    assert "waves per SM" in heads
    assert row(rows, variant="warp", dataset="random")["waves per SM"] == "0.65"
    assert row(rows, variant="tbe", dataset="random")["waves per SM"] == "1.00"
    heads, rows = table(panel_html(page, "s1-sol"), "Throughput as % of peak")
    assert row(rows, variant="tbe", dataset="random")["DRAM bandwidth"] == "3.7 TiB/s"
    assert row(rows, variant="base", dataset="medium")["DRAM bandwidth"] == "501.6 GiB/s"


def test_one_byte_convention_in_the_nsight_panels(page, imported):
    """Binary units (KiB ... TiB, GiB/s, TiB/s) throughout, and said; no decimal GB beside a GiB."""
    for doc, src in ((page, "s1"), (imported, "s1")):
        for pid in NCU_PANELS:
            text = words(panel_html(doc, f"{src}-{pid}"))
            assert not re.search(r"\d\s?[KMGT]B\b|[KMGT]B/s", text), (pid, re.findall(r".{30}[KMGT]B\b.{5}", text))
    assert "Bytes in binary units: KiB, MiB, GiB, TiB" in words(panel_html(page, "s1-memory"))


def test_the_prepass_chart_labels_do_not_overlap():
    """Fifteen (variant, dataset) bars of the H200 run: every label readable, none on another."""
    b = load_run(H200 / "paper-gpu").bench
    p = analyze.speedups(b[b["status"] == "ok"], "steady", against=("base",))
    p = p[p["variant"].isin(("l2p", "l2w", "combined"))].sort_values(["variant", "dataset"])
    fig = plots.prepass_figure(p, "Lookup kernel and L2 pre-pass per table launch, steady")
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t for t in ax.get_yticklabels() + ax.get_xticklabels() if t.get_text()]
    assert len(ax.get_yticklabels()) == 15
    boxes = [t.get_window_extent(renderer) for t in labels]
    for a, c in itertools.combinations(range(len(boxes)), 2):
        assert not boxes[a].overlaps(boxes[c]), (labels[a].get_text(), labels[c].get_text())
    assert "combined · one-item" in [t.get_text() for t in ax.get_yticklabels()]


def test_the_bandwidth_roofline_has_no_bar_past_its_roof(page):
    """Drawn from the run's own frame: each bar ends at or below its level's tick."""
    from characterize.analysis import ncu
    from characterize.report.sources import RunSource

    src = RunSource(load_run(H200 / "paper-gpu-profile"), 1)
    k = ncu.per_point(ncu.per_table(src.lookup_view, src.profile_points, 12))
    pts, roofs = ncu.bandwidth(k)
    assert (pts["bytes_per_s"] <= pts["peak_bytes_per_s"]).all()
    fig = plots.bandwidth_roofline_figure(pts, roofs, "Bandwidth roofline per point")
    assert {t.get_text() for t in fig.axes[0].get_legend().get_texts()} >= {"DRAM", "L2", "measured copy ceiling"}


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_the_notebook_runs_on_a_profile_only_and_a_bench_and_profile_run(run):
    from tests.test_notebooks import NOTEBOOKS, execute

    shown = "\n".join(execute(NOTEBOOKS[0], {"CHARACTERIZE_RUN": str(run)}))
    assert "profiled kernel(s) in the run" in shown and "long scoreboard" in shown
    assert ("tbe · random" if run.name == "paper-gpu" else "warp · random") in shown


def test_the_committed_h200_run_fills_every_panel_its_data_allows():
    """Bench, profile and the analysis added without the GPU, read as one run: every run panel
    that applies is built (none missing, none failed, none folded into the needs-a-GPU box),
    the answer says why from ncu, and the report says its static facts describe other
    kernel sources than were measured."""
    from characterize.report.panels.catalog import RUN_PANELS
    from characterize.report.render import build_report

    ctx = build_report(RUNS, strict=True)
    (src,) = ctx["sources"]
    shown = {p.id: p for sec in src.sections for p in sec.panels}
    assert not [p.id for p in shown.values() if p.missing or p.error or getattr(p, "collapsed", None)]
    # the run has no host-resident variant and one precision: those panels do not apply, every other does
    absent = {f"s1-{p.id}" for p in RUN_PANELS} - set(shown)
    assert absent == {"s1-cache-ratio", "s1-host-time", "s1-host-bytes", "s1-precision"}, absent
    (box,) = ctx["answers"]
    text = " ".join(box.sentences)
    assert "h200: use tbe (one-item, high, random) or warp (medium, low)" in text
    assert any("L2 91% of peak" in c.text for r in box.table.rows for c in r)
    notes = " ".join(getattr(b, "text", "") for b in shown["s1-environment"].blocks)
    assert "Analyzed with other kernel sources than were measured" in notes


def test_a_report_of_a_run_says_the_modes_its_point_file_recorded():
    """One .ncu-rep of a run reported alone: its collection modes come from the run's point
    file beside it (none/none on the H200), not ncu's defaults; a report with no run beside
    it still says they are not recorded."""
    page = report_html([H200 / "paper-gpu" / "ncu" / "tbe.ncu-rep"], strict=True)
    assert "--cache-control none, --clock-control none (recorded by the run beside the report" in words(page)
    assert "ncu&#39;s defaults" not in page and "ncu's defaults" not in words(page)
    probe = report_html([H200 / "ncu-probe" / "panels.ncu-rep"], strict=True)
    assert "ncu's defaults: --cache-control all" in words(probe)


def test_the_model_panels_are_per_table(page):
    """predictions.csv holds tbe's launch (450 us on random, 12 tables); beside the
    measurements per table (40.1 us) the model panels state it per table (37.5 us), so
    predicted against measured sits near the diagonal, not 12 times above it."""
    part = panel_html(page, "s1-predicted-vs-measured")
    heads, rows = table(part, "steady: prediction against measurement")
    tbe = row(rows, variant="tbe", dataset="random")
    assert tbe["predicted (µs)"] == "37.5" and tbe["measured (µs)"].startswith("40.1")
    assert all(abs(float(r["error"].rstrip("%"))) < 60 for r in rows)
    heads, rows = table(panel_html(page, "s1-predictions"), "PREDICTED by the model")
    assert {"predicted time per table (µs)", "predicted DRAM bytes per table"} <= set(heads)
    tbe = row(rows, variant="tbe", dataset="random", GPU="h200")
    assert tbe["predicted time per table (µs)"] == "37.5" and tbe["predicted DRAM bytes per table"] == "137.0 MiB"
    heads, rows = table(panel_html(page, "s1-why"), "PREDICTED, per table")
    assert float(row(rows, variant="tbe", dataset="random", GPU="h200")["dram (µs)"]) < 40
