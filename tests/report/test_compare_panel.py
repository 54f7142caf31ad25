"""The report's comparison panels on the committed H200 runs: each technique against base
per table (a run's own diff), and --pair putting any two kernels of one run side by side."""

from pathlib import Path

import pytest

from characterize.report.blocks import Missing
from characterize.report.panels import compare as panels
from characterize.report.sources import Pair, RunSource
from characterize.store import MergedRun, load_run

H200 = Path(__file__).resolve().parents[2] / "profiles" / "h200"


@pytest.fixture(scope="module")
def both_runs():
    """The bench+profile run (base, tbe) and the profile run (torch, warp, rpf, l2p, combined), merged as
    the report merges runs of one experiment."""
    return RunSource(MergedRun([load_run(H200 / "paper-gpu"), load_run(H200 / "paper-gpu-profile")]), 1)


def texts(table):
    return {(r[0].text, r[1].text): [c.text for c in r[2:]] for r in table.rows}


def test_each_technique_against_base_per_table(both_runs):
    assert panels._vs_applies(both_runs)
    table = panels._vs_base(both_runs).blocks[0]
    assert table.columns[:4] == ["dataset", "variant", "duration per table (µs)", "DRAM read per table"]
    rows = texts(table)
    assert [k for k in rows if k[0] == "medium"] == [("medium", "base"), ("medium", "tbe")]
    assert rows[("random", "base")][0] == "145" and rows[("random", "tbe")][0] == "40.3 (-72.1%)"
    assert rows[("random", "warp")][0] == "41.1 (-71.6%)" and rows[("random", "l2p")][0] == "144 (-0.6%)"
    assert rows[("random", "tbe")][2] == "4.2% (-11.6 pt)"   # a rate moves in points, never divided
    assert "per table" in table.note and "pre-pass left out" in table.note


def test_without_base_profiled_the_panel_says_why():
    src = RunSource(load_run(H200 / "paper-gpu-profile"), 1)
    with pytest.raises(Missing, match="base was not profiled .*profiled: combined, l2p, rpf, torch, warp"):
        panels._vs_base(src)


def test_a_pair_of_variants_within_one_run_is_compared_not_ignored(both_runs):
    pair = Pair(both_runs, both_runs, 1, ("base=tbe", "rpf/random=combined/random"))
    out = panels._c_metrics(pair)
    assert "Only the kernels given by hand are compared" in out.blocks[0].text
    table = out.blocks[1]
    assert "duration per table (µs)" in table.columns
    rows = {r[0].text: [c.text for c in r] for r in table.rows}
    assert set(rows) == {"base → tbe", "rpf → combined"}
    assert "chz_tbe_kernel (1 launch, 12 tables)" in rows["base → tbe"] and "manual (--pair)" in rows["base → tbe"]
    assert "90.1 → 93.7 (+4.0%)" in rows["rpf → combined"]
    bench = panels._c_bench(pair).blocks
    timed = [r[0].text for r in bench[0].rows]   # both pairs were benched too: per table, by dataset and mode
    assert timed.count("base → tbe") == 10 and timed.count("rpf → combined") == 2 and len(timed) == 12


def test_a_report_of_one_run_with_pairs_compares_only_those(tmp_path):
    """`report RUN --pair base=tbe`: the pair is compared within the run (kernels and timed
    points), its static facts are not diffed against themselves, and a pair that names
    nothing is refused rather than ignored."""
    import re

    from characterize.errors import ConfigError
    from characterize.report.render import render_report

    html = render_report([H200 / "paper-gpu"], tmp_path / "r.html", pairs=("base=tbe",), strict=True).read_text()
    ids = set(re.findall(r'id="(c1-[a-z-]+)"', html))
    assert {"c1-metrics", "c1-bench"} <= ids and not ids & {"c1-static", "c1-sass", "c1-predictions"}
    assert "base → tbe" in html
    with pytest.raises(ConfigError, match="Did you mean 'tbe'"):
        render_report([H200 / "paper-gpu"], tmp_path / "s.html", pairs=("base=tbz",))
