"""The rendered report in a real browser: headless Chromium, driven over the Chrome
DevTools Protocol through a pipe (--remote-debugging-pipe), so the test needs no
driver binary, no extra Python package and no network.

Checks: no console errors or exceptions, no request leaves the page, every figure is
present, decoded and not blank (pixel variance read back through a canvas), a kernel
named `void k<float, long>(...)` shows as text (and no element was made of it), and a
screenshot of the page is saved under tests/artifacts/ (git-ignored).
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pandas as pd
import pytest

from characterize.report.render import render_report
from tests.conftest import fixtures_dir
from tests.report.browser import CHECK_PAGE, Browser, chromium_path
from tests.report.test_report import HOSTILE_KERNEL, hostile_csv, make_gpu_run, profile_fixture

ARTIFACTS = Path(__file__).parents[1] / "artifacts"
PAPER_RUN = Path(__file__).parents[2] / "profiles" / "static-paper"
SASS_CSV = Path(__file__).parents[1] / "data" / "sass_hot_loops.csv"


@pytest.fixture(scope="module")
def chromium() -> str:
    path = chromium_path()
    if path is None:
        pytest.skip("headless Chromium not found (install Debian's `chromium` package: apt-get install -y chromium, "
                    "or set CHARACTERIZE_CHROMIUM)")
    return path


@pytest.mark.slow
def test_report_in_headless_chromium(chromium, tmp_path, record_property):
    run = make_gpu_run(tmp_path / "a100-run", tmp_path, profile_report=profile_fixture())
    report = render_report([run, hostile_csv(tmp_path)], tmp_path / "report.html", title="characterize: browser check")
    browser = Browser(chromium, tmp_path / "chromium-profile")
    try:
        session = browser.open_page(report.resolve().as_uri())
        page = browser.evaluate(session, CHECK_PAGE)
        shot = browser.screenshot(session, ARTIFACTS / "report.png")
        problems = browser.problems()
    finally:
        browser.close()
    print(f"\nscreenshot: {shot}")
    record_property("screenshot", str(shot))
    assert problems == []
    assert page["title"] == "characterize: browser check"
    figures = page["figures"]
    assert len(figures) == page["figureElements"] >= 12 and page["svgs"] == 0
    for f in figures:
        assert f["src"].startswith("data:image/png;base64,"), f
        assert f["complete"] and f["w"] > 100 and f["h"] > 100, f
        assert f["variance"] > 50 and 0.001 < f["dark"] < 0.9, f  # drawn on, not blank
    assert page["scripts"] == 0 and page["strayElements"] == 0
    assert HOSTILE_KERNEL in page["text"] and HOSTILE_KERNEL in page["kernelCells"]
    assert "CUDA events (GPU)" in page["text"] and "Nsight Compute" in page["text"]
    assert shot.is_file() and shot.read_bytes().startswith(b"\x89PNG")


# ------------------------------------------------------ every fixture, every new panel
#: the panels of an imported report this check requires, and the one whose data an older GPU or a
#: smaller section set may lack (then it must say why)
IMPORT_PANELS_CHECKED = ("time", "sol", "roofline", "memory", "stalls", "occupancy", "kernels", "rules")
MAY_LACK = {"roofline": "roofline counters"}


def _fixture_reports() -> list[str]:
    d = fixtures_dir()
    return sorted(p.name for p in d.glob("*.ncu-rep")) if d.is_dir() else []


def _check_page(chromium: str, html: Path, tmp: Path, shots: str) -> dict:
    """Open a report, check it like a user would, and screenshot every panel into
    tests/artifacts/panels/<shots>/<panel>.png."""
    browser = Browser(chromium, tmp / "chromium-profile")
    try:
        session = browser.open_page(html.resolve().as_uri(), width=1300)
        page = browser.evaluate(session, CHECK_PAGE)
        page["shots"] = {}
        for panel in page["panels"]:
            out = browser.element_screenshot(session, f'[id="{panel["id"]}"]', ARTIFACTS / "panels" / shots /
                                             f"{panel['id']}.png")
            page["shots"][panel["id"]] = out
        page["problems"] = browser.problems()
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        first = ARTIFACTS / "panels" / shots / "first-screen.png"
        first.parent.mkdir(parents=True, exist_ok=True)
        first.write_bytes(base64.b64decode(shot))
    finally:
        browser.close()
    assert page["problems"] == []
    assert page["scripts"] == 0 and page["strayElements"] == 0
    for f in page["figures"]:
        assert f["complete"] and f["w"] > 100 and f["h"] > 100, f
        assert f["variance"] > 50 and 0.001 < f["dark"] < 0.9, f  # drawn on, not blank
    assert not [p["id"] for p in page["panels"] if p["error"]]
    return page


def assert_answer_in_first_screen(page: dict, text: str) -> None:
    """The answer is the first box, whole within the first screen, and says `text`."""
    first = page["answers"][0]
    assert first["top"] < 200 and first["bottom"] <= page["viewport"]["height"], (first, page["viewport"])
    assert text in first["text"], first["text"][:300]


def _panel(page: dict, pid: str) -> dict:
    found = [p for p in page["panels"] if p["id"] == pid]
    assert found, f"panel {pid} is not on the page"
    return found[0]


def _shown(page: dict, pid: str, figures: int = 1) -> None:
    """The panel is there, has data, its figures are drawn, and its screenshot is not blank."""
    p = _panel(page, pid)
    assert not p["missing"], pid
    assert len(p["figures"]) >= figures, (pid, len(p["figures"]))
    assert p["tables"] or p["figures"], pid
    shot = page["shots"][pid]
    assert shot is not None and shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 3000, pid


@pytest.mark.slow
@pytest.mark.parametrize("name", _fixture_reports() or ["(no fixtures)"])
def test_every_fixture_report_shows_every_new_panel(chromium, ncu_fixtures, name, tmp_path):
    html = render_report([ncu_fixtures / name], tmp_path / "report.html", strict=True)
    page = _check_page(chromium, html, tmp_path, Path(name).stem)
    for pid in IMPORT_PANELS_CHECKED:
        p = _panel(page, f"s1-{pid}")
        if p["missing"] and pid in MAY_LACK:
            text = (tmp_path / "report.html").read_text()
            assert MAY_LACK[pid] in text, f"{pid} is missing without saying why"
            continue
        _shown(page, f"s1-{pid}", figures=0 if pid in ("kernels", "rules") else 1)
    assert "The kernel that matters is" in page["text"]
    assert "finding(s) x" in page["text"]  # the ranked rule x kernel matrix
    assert_answer_in_first_screen(page, "The kernel that matters is")


@pytest.mark.slow
def test_no_gpu_runs_and_their_comparison(chromium, tmp_path):
    """The committed no-GPU run (plus a SASS table) and a second one made by another
    commit: predictions in the headline, locality from K = 1, the SASS panel, and the
    static, SASS and prediction diffs of the two."""
    a = tmp_path / "static-paper"
    shutil.copytree(PAPER_RUN, a)
    shutil.copy(SASS_CSV, a / "sass.csv")
    b = tmp_path / "static-paper-next"
    shutil.copytree(a, b)
    static = pd.read_csv(b / "static.csv")
    static.loc[static["variant"] == "rpf", "spill_loads"] += 8
    static.to_csv(b / "static.csv", index=False)
    sass = pd.read_csv(b / "sass.csv")
    sass.loc[sass["variant"] == "rpf", "rows_in_flight"] += 0.5
    sass.to_csv(b / "sass.csv", index=False)
    pred = pd.read_csv(b / "predictions.csv")
    pred.loc[pred["variant"] == "rpf", "time_us"] *= 1.1
    pred.to_csv(b / "predictions.csv", index=False)
    html = render_report([a, b], tmp_path / "runs.html", strict=True)
    page = _check_page(chromium, html, tmp_path, "no-gpu-runs")
    assert_answer_in_first_screen(page, "a100-80gb: use ")
    assert "PREDICTED by the model" in page["answers"][0]["text"] and "public measurements" in page["answers"][0]["text"]
    print(f"\nno-GPU report of two runs: {page['pageHeight']} px tall")
    for pid in ("headline", "static", "predictions"):
        _shown(page, f"s1-{pid}", figures=0)
    for pid in ("locality", "sweep", "sass"):
        _shown(page, f"s1-{pid}")
    for pid in ("static", "sass", "predictions"):
        _shown(page, f"c1-{pid}", figures=0)
    text = page["text"]
    # the headline draws the predictions with their bands; their table is one click away
    assert "Predicted speedup (a100-80gb)" in text and "MODEL'S PREDICTIONS, not measurements" in text
    assert "PREDICTED speedup over base" in html.read_text()
    # the SASS figure is shown; its table (one row per variant) is one click away, folded under its caption
    assert "Hot loop of each lookup kernel" in text and "rows in flight (SASS)" in html.read_text()
    assert "spill_loads" in text and "rpf" in text


@pytest.mark.slow
def test_gpu_run_new_panels_in_chromium(chromium, tmp_path):
    if profile_fixture() is None:
        pytest.skip("needs the real A100 report for the profiled points")
    run = make_gpu_run(tmp_path / "a100-run", tmp_path, profile_report=profile_fixture())
    shutil.copy(SASS_CSV, run / "sass.csv")
    html = render_report([run], tmp_path / "run.html", strict=True)
    page = _check_page(chromium, html, tmp_path, "gpu-run")
    for pid in ("sol", "roofline", "memory", "stalls", "occupancy", "sass", "headline"):
        _shown(page, f"s1-{pid}", figures=0 if pid == "headline" else 1)
    assert_answer_in_first_screen(page, "MEASURED with CUDA events")
    _shown(page, "s1-rules", figures=0)
