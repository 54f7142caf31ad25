"""The report stage: runs and ncu reports -> one self-contained, escaped HTML page.

Runs are built the ways the project makes them without a GPU: the CPU-emulation bench
and the stand-in ncu through the CLI (one module-scoped run), static and locality
steps of the experiment stage, and recorded GPU runs written point by point with the
store's writer (what a run on an A100 leaves behind), profiled points carrying a real
A100 report from the shared fixtures when they exist.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from html import escape as html_escape
from pathlib import Path

import pandas as pd
import pytest

from characterize.analysis.answer import ModelValidation, answer_run
from characterize.errors import ReportError, ToolchainNotFound
from characterize.extract.ncu_csv import read_csv
from characterize.pipeline import load_experiment, locality_step, run_meta, static_step, sweeps_step
from characterize.report import render as rpt
from characterize.report.layout import NEEDS, Panel
from characterize.report.panels.catalog import COMPARE_PANELS, IMPORT_PANELS, RUN_PANELS
from characterize.report.provenance import PROVENANCE
from characterize.report.render import render_report, report_html
from characterize.store import RunDir, load_run
from tests.conftest import fixtures_dir, write_experiment

DATA = Path(__file__).parents[1] / "data" / "ncu_csv"
FIXTURE_REPORT = "a100_mistic_msdnew.ncu-rep"
HOSTILE_KERNEL = "void k<float, long>(const float *, long &)"
HOSTILE_VARIANT = "<img src=x onerror=alert(1)>"

A100 = {"name": "NVIDIA A100-SXM4-80GB", "key": "a100-80gb", "arch": "sm_80", "sm_count": 108,
        "l2_bytes": 41943040, "memory_bytes": 85899345920, "driver": "550.54.15", "cuda_runtime": "12.4",
        "sm_clock_MHz": 1410, "max_sm_clock_MHz": 1410, "memory_clock_MHz": 1593, "hbm_GBps": 2039.0}
BASE_US = {"one-item": 100.0, "high": 150.0, "medium": 220.0, "low": 280.0, "random": 320.0}
FACTOR = {"torch": 1.05, "base": 1.0, "optmt": 0.8, "rpf": 0.7, "l2p": 0.75, "l2w": 0.78, "combined": 0.55,
          "warp": 0.45}


def experiment_file(tmp: Path, name: str = "tiny", datasets=("medium", "random"), variants=("torch", "base", "l2p"),
                    modes=("steady", "cold")) -> Path:
    return write_experiment(tmp, name, datasets, variants, modes, caps=(40, 48), max_reps=3, budget=0.2)


def _summary(variant: str, dataset: str, mode: str) -> dict:
    t = BASE_US.get(dataset, 200.0) * FACTOR.get(variant, 1.0) * (1.25 if mode == "cold" else 1.0)
    pre = 18.0 if variant in ("l2p", "combined") else 0.0
    moved = 127 * 10 * (68 * 4 + 8) + 127 * 8 + 127 * 68 * 4
    return {"mode": mode, "per_batch_us": 2 * t, "per_table_us": t, "ci95_us": 0.01 * t, "rel_ci": 0.01,
            "rel_std": 0.02, "stable": True, "reps": 20, "median_per_table_us": t, "min_per_table_us": 0.97 * t,
            "prepass_per_table_us": pre, "per_table_incl_prepass_us": t + pre, "ci95_incl_prepass_us": 0.01 * (t + pre),
            "bytes_per_table": moved, "effective_GBps": moved / t / 1e3, "hbm_pct": 100 * moved / t / 1e3 / 2039,
            "seconds": 0.5}


def make_gpu_run(path: Path, tmp: Path, *, variants=("torch", "base", "optmt", "l2p", "combined"),
                 datasets=("medium", "random"), modes=("steady", "cold"), profile_report: Path | None = None,
                 predictions: bool = True, static: bool = True, locality: bool = True,
                 failed_profile: tuple[str, str] | None = ("l2p", "random"), name: str | None = None) -> Path:
    """A run as a measurement on an A100 leaves it: meta, bench points, static rows, trace
    locality, profiled points (copies of a real A100 report) and model predictions."""
    known = [v for v in variants if v in FACTOR]
    exp = load_experiment(str(experiment_file(tmp, name or path.name, datasets, known or ["base"], modes)))
    meta = run_meta(exp, path, None, "cuda") | {"gpu": A100, "backend": "cuda"}
    run = RunDir.create(path, meta)
    for v in variants:
        for d in datasets:
            run.write_point("bench", v, d, {"status": "ok", "backend": "cuda", "gpu": A100["name"],
                                            "summary": [_summary(v, d, m) for m in modes],
                                            "repetitions": [{"mode": m, "rep": r, "kernel_us": 1.0, "prepass_us": 0.0}
                                                            for m in modes for r in range(3)]})
    if static:
        rows = []
        for v in known:
            capped = v in ("optmt", "rpf", "combined")
            rows.append({"variant": v, "arch": "sm_80", "maxrregcount": 48 if capped else None,
                         "kernel": "chz_base_kernel<false>", "role": "lookup", "registers": 48 if capped else 54,
                         "spill_stores": 16 if capped else 0, "spill_loads": 28 if capped else 0, "stack_frame": 24,
                         "shared_mem": 0, "block_size": 256, "blocks_per_sm": 5 if capped else 4,
                         "theoretical_occupancy_pct": 62.5 if capped else 50.0, "limiter": "registers",
                         "sweep": False, "compiler": "nvcc 13.0"})
            for cap, regs, sp, blocks in ((40, 40, 288, 6), (48, 48, 44, 5), (64, 54, 0, 4)):
                rows.append({**rows[-1], "maxrregcount": cap, "registers": regs, "spill_stores": sp // 3,
                             "spill_loads": sp - sp // 3, "blocks_per_sm": blocks,
                             "theoretical_occupancy_pct": 12.5 * blocks, "sweep": True})
        run.write("static", pd.DataFrame(rows))
    if locality:
        locality_step(run, exp)
    if profile_report is not None:
        for v in ("base", "l2p"):
            for d in datasets:
                if (v, d) == failed_profile or v not in variants:
                    continue
                dest = path / "ncu" / f"{v}__{d}.ncu-rep"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(profile_report, dest)
                run.write_point("profile", v, d, {"status": "ok", "report": str(dest.relative_to(path)), "kernels": 1,
                                                  "ncu_version": "2025.3.1.0", "cache_control": "none",
                                                  "clock_control": "base", "replay_mode": "kernel",
                                                  "metric_set": "default", "scoping": "nvtx"})
    if failed_profile:
        run.write_point("profile", *failed_profile, {"status": "failed",
                                                     "error": "ncu exited with code -9 (killed by SIGKILL)"})
    if predictions:
        rows = []
        for gpu, arch in (("a100-80gb", "sm_80"), ("h100-sxm", "sm_90")):
            for v in known:
                for d in datasets:
                    t = 0.9 * BASE_US.get(d, 200) * FACTOR[v] * (0.8 if arch == "sm_90" else 1.0)
                    rows.append({"variant": v, "dataset": d, "arch": arch, "gpu": gpu, "mode": "steady",
                                 "l2_hit_rate_pct": 40.0 + 10 * FACTOR[v], "dram_bytes": 3e6, "l2_bytes": 5e6,
                                 "time_us": t, "time_us_low": 0.8 * t, "time_us_high": 1.3 * t,
                                 "speedup_vs_base": 1 / FACTOR[v], "loads_in_flight": 3 if v in ("rpf", "combined")
                                 else 8 if v == "warp" else 1})
        run.write("predictions", pd.DataFrame(rows))
    run.update_meta(steps={"static": "done", "locality": "done", "bench": "done", "profile": "done"})
    return path


def profile_fixture() -> Path | None:
    p = fixtures_dir() / FIXTURE_REPORT
    return p if p.is_file() else None


def panel_html(html: str, panel_id: str) -> str:
    """The HTML of one panel (up to the next panel)."""
    start = html.index(f'id="{panel_id}"')
    nxt = re.compile(r'<div class="panel[ "]').search(html, start + 1)
    return html[start: nxt.start() if nxt else len(html)]


def with_section(html: str, panel_id: str) -> str:
    """A panel's HTML preceded by its section's provenance line (said once per section)."""
    start = html.index(f'id="{panel_id}"')
    sec = html.rfind("<section id=", 0, start)
    head = html[sec:html.index('<div class="panel', sec)] if sec >= 0 else ""
    return head + panel_html(html, panel_id)


def reason(html: str, panel_id: str) -> str:
    """A missing panel's reason, following 'for the reason given above' to the panel it names."""
    part = panel_html(html, panel_id)
    if "for the reason given above" not in part:
        return part
    ids = re.findall(r'<div class="panel[^"]*" id="([^"]+)"', html)
    return reason(html, ids[ids.index(panel_id) - 1])


def is_missing(html: str, panel_id: str) -> bool:
    return 'class="panel is-missing" id="' + panel_id + '"' in html


def images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def external_references(html: str) -> list[str]:
    """Attributes that would make a browser fetch something."""
    return re.findall(r'(?:src|href)\s*=\s*"(?!data:|#)([^"]*)"', html) + re.findall(r"url\(\s*['\"]?(?!data:)", html) \
        + re.findall(r"@import", html)


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("gpu")
    return make_gpu_run(tmp / "a100", tmp, profile_report=profile_fixture())


@pytest.fixture(scope="module")
def gpu_html(gpu_run, tmp_path_factory) -> str:
    out = render_report([gpu_run], tmp_path_factory.mktemp("out") / "a100.html", strict=True)
    return out.read_text()


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A small recorded GPU run (few figures) for the tests that render several times."""
    tmp = tmp_path_factory.mktemp("small")
    return make_gpu_run(tmp / "small", tmp, variants=("base", "l2p"), datasets=("medium",), modes=("steady",),
                        profile_report=profile_fixture(), failed_profile=None)


@pytest.fixture(scope="module")
def emulated_run(tmp_path_factory) -> Path:
    """The CPU-emulation bench and, when the fixture report exists, the stand-in ncu,
    both through the CLI, plus the static and locality steps."""
    tmp = tmp_path_factory.mktemp("emu")
    exp_path = experiment_file(tmp, "emu", datasets=("medium", "random"), variants=("base", "l2p"))
    out = tmp / "run"
    r = subprocess.run([sys.executable, "-m", "characterize.cli", "bench", str(exp_path), "--backend", "emulate",
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    exp = load_experiment(str(exp_path))
    run = RunDir(out)
    try:
        static_step(run, exp)
        sweeps_step(run, exp)   # the register sweep
    except ToolchainNotFound:
        pass  # the report then says static.csv is missing; checked below
    locality_step(run, exp)
    report = profile_fixture()
    if report is not None:
        ncu = tmp / "bin" / "ncu"
        ncu.parent.mkdir()
        ncu.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).parents[1] / 'fakes' / 'fake_ncu.py'} \"$@\"\n")
        ncu.chmod(0o755)
        env = {**os.environ, "FAKE_NCU_LOG": str(tmp / "ncu.jsonl"), "FAKE_NCU_REPORT": str(report),
               "CHARACTERIZE_BACKEND": "emulate"}
        p = subprocess.run([sys.executable, "-m", "characterize.cli", "profile", str(exp_path), "--ncu", str(ncu),
                            "--out", str(out), "--resume", "--variants", "base", "--datasets", "medium"],
                           capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr + p.stdout
    return out


# ------------------------------------------------------------------- panels
def test_panels_are_declared_as_data():
    for panels in (RUN_PANELS, IMPORT_PANELS, COMPARE_PANELS):
        ids = [p.id for p in panels]
        assert len(ids) == len(set(ids))
        for p in panels:
            assert isinstance(p, Panel) and p.title and p.section and p.how and callable(p.builder)
            assert set(p.needs) <= set(NEEDS)
            if not callable(p.provenance):
                assert set(p.provenance) <= set(PROVENANCE)
    sections = {p.section for p in RUN_PANELS}
    assert {"Overview", "Workload locality", "Static characterization", "Timing",
            "Microarchitecture (Nsight Compute)", "Nsight Compute rule findings", "Model predictions"} <= sections


# --------------------------------------------------------------- a GPU run
def test_gpu_run_renders_every_section_with_provenance(gpu_html):
    html = gpu_html
    assert html.startswith("<!DOCTYPE html>")
    assert "default-src 'none'" in html and not external_references(html)
    for pid in ("environment", "contents", "headline", "locality", "static", "sweep", "latency", "speedup",
                "bandwidth", "prepass", "predictions", "predicted-vs-measured", "failures"):
        assert f'id="s1-{pid}"' in html and not is_missing(html, f"s1-{pid}"), pid
    assert "panel is-error" not in html
    env = panel_html(html, "s1-environment")
    for text in ("NVIDIA A100-SXM4-80GB", "550.54.15", "SM 1410 MHz", "--cache-control none", "--clock-control none",
                 "git revision", "command line", "torch"):
        assert text in env, text
    # provenance of every kind of number
    assert "CUDA events (GPU)" in with_section(html, "s1-latency")
    assert "static analysis" in with_section(html, "s1-static") and "trace analysis" in with_section(html, "s1-locality")
    preds = panel_html(html, "s1-predictions")
    assert "model prediction" in preds and "PREDICTED speedup over base on a100-80gb" in preds
    assert "+103%" not in preds   # the paper's claims are about the paper's configuration only
    assert "CPU emulation" not in with_section(html, "s1-latency")
    assert "steady mode: L2 warm" in html and "cold mode: L2 flushed" in html and "not locked" in html
    # headline beside the paper's claims
    head = panel_html(html, "s1-headline")
    assert "up to +53%" not in head and "up to +103%" not in head and "1.82×" in head  # combined = 1 / 0.55
    assert "pre-pass included" in panel_html(html, "s1-prepass")
    bw = panel_html(html, "s1-bandwidth")
    assert "HBM peak" in bw and "2,039" in bw
    pvm = panel_html(html, "s1-predicted-vs-measured")
    assert "GMAE" in pvm and "PREDICTION" in pvm
    assert "killed by SIGKILL" in panel_html(html, "s1-failures")
    pngs = images(html)
    assert len(pngs) >= 12 and all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    assert html.count("<img ") == html.count("<figure")


def test_gpu_run_ncu_sections(gpu_html):
    if profile_fixture() is None:
        pytest.skip(f"needs the real A100 report {fixtures_dir() / FIXTURE_REPORT} for the profiled points")
    html = gpu_html
    for pid in ("occupancy", "stalls", "memory", "kernels", "rules"):
        assert not is_missing(html, f"s1-{pid}"), pid
        assert "Nsight Compute" in with_section(html, f"s1-{pid}")
    occ = with_section(html, "s1-occupancy")
    assert "80.6%" in occ and "--cache-control none" in occ and "--clock-control base" in occ
    for pid in ("stalls", "memory"):
        part = with_section(html, f"s1-{pid}")
        assert "<figcaption>" in part and "--cache-control none" in part
    assert "long scoreboard" in panel_html(html, "s1-stalls")
    rules = panel_html(html, "s1-rules")
    assert "Uncoalesced Global Accesses" in rules and "@section:" not in rules


@pytest.mark.slow
def test_figures_and_pages_are_deterministic(small_run, tmp_path):
    a = render_report([small_run], tmp_path / "a.html").read_bytes()
    b = render_report([small_run], tmp_path / "b.html").read_bytes()
    assert len(images(a.decode())) >= 5
    assert a == b


# --------------------------------------------------------- an emulated run
@pytest.mark.slow
def test_emulated_run_is_labelled_cpu_emulation(emulated_run, tmp_path):
    html = render_report([emulated_run], tmp_path / "emu.html", strict=True).read_text()
    for pid in ("headline", "latency", "speedup", "bandwidth", "prepass"):
        part = with_section(html, f"s1-{pid}")
        assert "CPU emulation: NOT GPU performance" in part and "CUDA events (GPU)" not in part, pid
    assert "say NOTHING about GPU performance" in panel_html(html, "s1-headline")
    assert "meta.json has no GPU" in panel_html(html, "s1-bandwidth")
    assert "no predictions.csv" in reason(html, "s1-predicted-vs-measured")
    assert "no predictions.csv" in panel_html(html, "s1-predictions")
    assert not is_missing(html, "s1-locality")
    if (emulated_run / "static.csv").is_file():
        static = panel_html(html, "s1-static")
        assert "chz_base_kernel&lt;false&gt;" in static and "chz_base_kernel<false>" not in static
        assert not is_missing(html, "s1-sweep")
    else:
        assert "no static.csv" in panel_html(html, "s1-static")
    if profile_fixture() is not None:
        assert not is_missing(html, "s1-occupancy") and "--cache-control none" in with_section(html, "s1-occupancy")
    else:   # nothing profiled: the panel is missing, or listed in the one box of what only a GPU run fills
        box = re.search(r'<details class="panel gpu-box".*?</details>', html, re.S)
        assert is_missing(html, "s1-occupancy") or (box and "Achieved vs theoretical occupancy" in box.group(0))


# ------------------------------------------------------------- partial runs
def test_static_and_locality_only_run_says_why_the_rest_is_missing(tmp_path):
    exp = load_experiment(str(experiment_file(tmp_path, "nogpu")))
    path = tmp_path / "nogpu"
    run = RunDir.create(path, run_meta(exp, path, None))
    locality_step(run, exp)
    run.update_meta(steps={"static": "skipped: no nvcc", "locality": "done",
                           "bench": "skipped: no CUDA GPU on this machine",
                           "profile": "skipped: no CUDA GPU on this machine"})
    html = report_html([path], strict=True)
    assert not is_missing(html, "s1-locality")
    assert is_missing(html, "s1-headline") and "no CUDA GPU on this machine" in reason(html, "s1-headline")
    # what only a GPU run fills is one collapsed box naming each panel, why it is empty and the command
    box = html[html.index('id="s1-needs-gpu"'):]
    box = box[:box.index("</details>")]
    assert "Needs a GPU: 11 more panels" in box and "characterize run nogpu.toml --out" in box and "--resume" in box
    for pid in ("latency", "speedup", "bandwidth", "prepass", "occupancy", "stalls", "memory", "kernels", "rules"):
        assert f'id="s1-{pid}"' not in html, pid
    for title in ("Latency per variant and dataset", "Warp stalls weighted by time", "Nsight Compute rule findings"):
        assert title in box, title
    assert "no CUDA GPU on this machine" in box and "profile step was skipped" in box
    assert "static step was skipped: no nvcc" in panel_html(html, "s1-static")
    assert "no predictions.csv" in panel_html(html, "s1-predictions")
    assert "No failed points." in panel_html(html, "s1-failures")
    assert "GPU" in panel_html(html, "s1-environment") and "no CUDA GPU was visible" in html


def test_a_run_whose_points_all_failed_lists_the_failures(tmp_path):
    exp = load_experiment(str(experiment_file(tmp_path, "failing")))
    path = tmp_path / "failing"
    run = RunDir.create(path, run_meta(exp, path, None, "emulate"))
    run.write_point("bench", "base", "bad.txt", {"status": "failed", "error": "index 5000 outside E=1009 at 2"})
    run.write_point("bench", "torch", "bad.txt", {"status": "failed", "error": "index 5000 outside E=1009 at 2"})
    run.write_point("profile", "base", "medium", {"status": "failed", "error": "ERR_NVGPUCTRPERM <no permission>"})
    html = report_html(load_run(path), strict=True)
    assert "all 2 bench point(s) failed" in panel_html(html, "s1-latency")
    assert "all 1 profile point(s) failed" in reason(html, "s1-occupancy")
    fails = panel_html(html, "s1-failures")
    assert "index 5000 outside E=1009" in fails and "ERR_NVGPUCTRPERM &lt;no permission&gt;" in fails
    assert "no locality.json" in panel_html(html, "s1-locality")


@pytest.mark.slow
def test_an_unreadable_report_costs_only_its_point(tmp_path):
    report = profile_fixture()
    if report is None:
        pytest.skip(f"needs the real A100 report {fixtures_dir() / FIXTURE_REPORT} for the profiled points")
    path = make_gpu_run(tmp_path / "cut", tmp_path, variants=("base", "l2p"), profile_report=report,
                        predictions=False, failed_profile=None)
    (path / "ncu" / "l2p__random.ncu-rep").write_bytes(report.read_bytes()[:1000])
    html = report_html([path], strict=True)
    assert not is_missing(html, "s1-occupancy") and "l2p · random" not in panel_html(html, "s1-occupancy")
    assert "1 report(s) unreadable" in panel_html(html, "s1-contents")
    fails = panel_html(html, "s1-failures")
    assert "profile report" in fails and "l2p__random.ncu-rep" in fails
    assert "rule findings could not be read" in panel_html(html, "s1-rules")


def test_a_broken_panel_is_shown_not_fatal(monkeypatch, tmp_path):
    def boom(src):
        raise RuntimeError("exploded <here>")

    # only the panel under test: the others are checked elsewhere
    monkeypatch.setattr(rpt, "RUN_PANELS", rpt.RUN_PANELS[:2] + (Panel("boom", "Boom", "Overview", (), ("meta",),
                                                                       "a test panel", boom),))
    path = make_gpu_run(tmp_path / "tiny", tmp_path, variants=("base",), datasets=("medium",), modes=("steady",),
                        predictions=False, static=False, locality=False, failed_profile=None)
    html = report_html([path])
    assert "could not be built" in panel_html(html, "s1-boom") and "exploded &lt;here&gt;" in html
    with pytest.raises(RuntimeError):
        report_html([path], strict=True)


# ------------------------------------------------------------ imported files
def test_imported_ncu_report_renders_as_a_generic_kernel_report(ncu_fixtures, tmp_path):
    out = render_report([ncu_fixtures / "h800_sglang.ncu-rep"], tmp_path / "sglang.html", strict=True)
    html = out.read_text()
    for pid in ("summary", "time", "sol", "roofline", "memory", "stalls", "occupancy", "kernels", "rules"):
        assert f'id="s1-{pid}"' in html and not is_missing(html, f"s1-{pid}"), pid
    assert "Headline" not in html and "Trace locality" not in html
    kernels = panel_html(html, "s1-kernels")
    assert "flash_fwd_kernel&lt;Flash_fwd_kernel_traits&lt;" in kernels and "NVIDIA H800" in panel_html(html, "s1-summary")
    assert "const at::TensorBase &amp;" in kernels and "<Flash_fwd" not in html
    assert "not recorded in the report" in html and "Nsight Compute" in with_section(html, "s1-kernels")
    assert "ERROR" in panel_html(html, "s1-rules")
    assert len(images(html)) >= 3


def test_imported_csv_without_rules_says_so():
    html = report_html([DATA / "h800_sglang_raw.csv"], strict=True)
    assert not is_missing(html, "s1-kernels")
    assert is_missing(html, "s1-rules") and "carries none" in panel_html(html, "s1-rules")


def test_unreadable_source_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match="no such run directory or report file"):
        report_html([tmp_path / "nope"])
    with pytest.raises(ReportError, match="at least one"):
        report_html([])


# ------------------------------------------------------------------ escaping
def hostile_csv(tmp: Path) -> Path:
    """An ncu CSV raw page whose kernel is called `void k<float, long>(const float *, long &)`."""
    text = (DATA / "h800_sglang_raw.csv").read_text().splitlines()
    header, units = text[0], text[1]
    row = next(line for line in text[2:] if line.startswith('"4"'))
    cells = next(csv.reader([row]))
    cells[4] = HOSTILE_KERNEL
    out = tmp / "hostile.csv"
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL).writerow(cells)
    out.write_text("\n".join([header, units, buf.getvalue().strip()]) + "\n")
    return out


def hostile_metrics(run: str, variant: str, kernel: str, function: str) -> pd.DataFrame:
    """A tidy metrics frame (from a recorded CSV) relabelled with the given names."""
    df = read_csv(DATA / "h800_sglang_raw.csv", run=run)
    df = df[df["kernel_id"] == df["kernel_id"].min()].copy()
    df["variant"], df["dataset"], df["kernel_name"], df["function"] = variant, "medium", kernel, function
    df["cache_control"], df["clock_control"] = "none", "base"
    return df


def test_hostile_names_are_escaped(tmp_path):
    path = make_gpu_run(tmp_path / "hostile", tmp_path, variants=("base", HOSTILE_VARIANT), predictions=False,
                        failed_profile=None)
    run = load_run(path)
    run.metrics = hostile_metrics(run.name, HOSTILE_VARIANT, "<script>alert('kernel')</script>" + HOSTILE_KERNEL,
                                  "<b>k</b>")
    html = report_html([run, hostile_csv(tmp_path)], strict=True)
    assert "<script" not in html.lower() and "<b>k</b>" not in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;script&gt;alert(&#39;kernel&#39;)&lt;/script&gt;" in html
    assert "void k&lt;float, long&gt;(const float *, long &amp;)" in html
    assert html.count("<img ") == html.count("<figure") == len(images(html))


# ------------------------------------------------------------- two sources
@pytest.mark.slow
def test_two_runs_compare_and_list_unmatched_points_and_kernels(tmp_path):
    a = make_gpu_run(tmp_path / "a", tmp_path, variants=("base", "optmt"), datasets=("medium",),
                     predictions=False, failed_profile=None)
    b = make_gpu_run(tmp_path / "b", tmp_path, variants=("base", "warp"), datasets=("medium",),
                     predictions=False, failed_profile=None)
    ra, rb = load_run(a), load_run(b)
    ra.metrics = pd.concat([hostile_metrics("a", "base", "void chz_base_kernel<false>(...)", "chz_base_kernel"),
                            hostile_metrics("a", "optmt", "void chz_base_kernel<false>(...)", "chz_base_kernel")])
    rb.metrics = pd.concat([hostile_metrics("b", "base", "void chz_base_kernel<false>(...)", "chz_base_kernel"),
                            hostile_metrics("b", "warp", "void chz_warp_kernel<8>(...)", "chz_warp_kernel")])
    html = report_html([ra, rb], strict=True)
    assert 'id="c1"' in html and "b vs a" in html
    bench = panel_html(html, "c1-bench")
    assert "Unmatched timed points (4)" in bench
    assert re.search(r"optmt</td><td[^>]*>medium</td><td[^>]*>steady</td><td[^>]*>a</td>", bench)
    assert re.search(r"warp</td><td[^>]*>medium</td><td[^>]*>steady</td><td[^>]*>b</td>", bench)
    metrics = panel_html(html, "c1-metrics")
    assert "Unmatched kernels (2)" in metrics and "chz_warp_kernel" in metrics and "L2 hit rate" in metrics
    assert "Nsight Compute" in with_section(html, "c1-metrics")


@pytest.mark.slow
def test_a_run_compared_with_an_imported_report(small_run, tmp_path):
    html = report_html([small_run, hostile_csv(tmp_path)], strict=True)
    assert 'id="s2-kernels"' in html and 'id="c1-metrics"' in html and 'id="c1-bench"' not in html
    if profile_fixture() is not None:
        assert "Unmatched kernels" in panel_html(html, "c1-metrics")


# ------------------------------------------------------------ notebook use
@pytest.mark.slow
def test_render_report_takes_a_bare_source_and_returns_the_path(small_run, tmp_path):
    out = render_report(small_run, tmp_path, title="A100 <run>")
    assert out == tmp_path / "report.html" and out.is_file()
    assert "<title>A100 &lt;run&gt;</title>" in out.read_text()


# --------------------------------------------------------------- performance
@pytest.mark.slow
def test_paper_size_report_renders_in_seconds(tmp_path):
    datasets = ("one-item", "high", "medium", "low", "random")
    variants = tuple(FACTOR)
    path = make_gpu_run(tmp_path / "paper", tmp_path, variants=variants, datasets=datasets,
                        profile_report=profile_fixture(), locality=False)
    rows = {d: {"lookups": 307200, "unique_rows": int(2e5 * (i + 1) / 5), "rows": 500000, "row_bytes": 512,
                "top_k_coverage": {"60000": 1 - 0.1 * i, "81920": 1 - 0.08 * i},
                "reuse_distance_quantiles": {"p50": 10 ** (i + 1), "p90": 10 ** (i + 2)},
                "cold_fraction": 0.1 * i, "bytes_touched": 1e8,
                "reuse_histogram": [[-1, -1, 0.1 * i]] + [[2 ** j if j else 0, 2 ** (j + 1), 0.02] for j in range(18)]}
            for i, d in enumerate(datasets)}
    (path / "locality.json").write_text(json.dumps(rows))
    start = time.perf_counter()
    html = report_html([path], strict=True)
    seconds = time.perf_counter() - start
    print(f"paper-size report rendered in {seconds:.2f} s ({len(html) / 1e6:.1f} MB)")
    assert seconds < 30
    assert not is_missing(html, "s1-headline") and "panel is-error" not in html


# -------------------------------------------------- issue 11: what a colleague needs
PAPER_RUN = Path(__file__).parents[2] / "profiles" / "static-paper"
SASS_CSV = Path(__file__).parents[1] / "data" / "sass_hot_loops.csv"


@pytest.fixture(scope="module")
def no_gpu_run(tmp_path_factory) -> Path:
    """The committed no-GPU run with a model band and a SASS table, as the current pipeline writes them."""
    path = tmp_path_factory.mktemp("nogpu") / "static-paper"
    shutil.copytree(PAPER_RUN, path)
    p = pd.read_csv(path / "predictions.csv")
    if "time_us_low" not in p.columns:
        p["time_us_low"], p["time_us_high"] = 0.85 * p["time_us"], 1.3 * p["time_us"]
        p.to_csv(path / "predictions.csv", index=False)
    shutil.copy(SASS_CSV, path / "sass.csv")
    return path


@pytest.fixture(scope="module")
def no_gpu_html(no_gpu_run) -> str:
    """That run's report, rendered once for the tests that only read it."""
    return report_html([no_gpu_run], strict=True)


def test_nothing_measured_the_headline_shows_predictions_with_bands(no_gpu_html):
    html = no_gpu_html
    head = panel_html(html, "s1-headline")
    assert not is_missing(html, "s1-headline")
    assert "MODEL&#39;S PREDICTIONS, not measurements" in head and "PREDICTED speedup over base on a100-80gb" in head
    assert re.search(r"\d\.\d\d× \[\d\.\d\d–\d\.\d\d\]", head) and "model prediction" in head
    assert "CUDA events" not in head and "no CUDA GPU on this machine" in head


@pytest.mark.slow
def test_sass_panel_sets_the_hot_loop_beside_the_model(no_gpu_run, no_gpu_html, tmp_path):
    html = no_gpu_html
    sass = panel_html(html, "s1-sass")
    assert not is_missing(html, "s1-sass") and "<figure" in sass
    for text in ("rows in flight (SASS)", "model assumes", "4 × 64-bit, 4 × 32-bit", "8 × 128-bit", "2.12",
                 "model and SASS agree", "Not measured: no Nsight Compute"):
        assert text in sass, text
    # a model that assumed more than the code does is called out
    assuming = tmp_path / "assuming"
    shutil.copytree(no_gpu_run, assuming)
    p = pd.read_csv(assuming / "predictions.csv")
    p.loc[p["variant"] == "base", "loads_in_flight"] = 1.16
    p.to_csv(assuming / "predictions.csv", index=False)
    assert "the model assumes 1.4x the rows in flight the SASS keeps" in panel_html(report_html([assuming]), "s1-sass")
    bare = tmp_path / "bare"
    shutil.copytree(no_gpu_run, bare)
    (bare / "sass.csv").unlink()
    html = report_html([bare], strict=True)
    assert is_missing(html, "s1-sass") and "no sass.csv in the run directory" in panel_html(html, "s1-sass")


def test_the_answer_is_the_first_box(no_gpu_run, no_gpu_html):
    """Above everything else: per dataset and GPU what to use, by how much (with the band),
    what limits it, the whole step, and how the number was obtained; the same rows as
    analysis.answer gives the terminal and the notebook."""
    html = no_gpu_html
    start = html.index('<section class="answer')
    assert start < html.index("Where the numbers come from") < html.index('<div class="panel')
    box = html[start:html.index("</section>", start)]
    assert "a100-80gb: use " in box
    assert "PREDICTED by the model, not measured" in box
    # how sure: the model's stored error on public measurements it was not fitted to
    assert "GMAE is" in box and "public measurements from" in box
    agree = int(load_run(no_gpu_run).model_validation["agrees"].astype(str).str.lower().eq("true").sum())
    assert f"reproduces {agree} of the paper&#39;s 4 published claims" in box
    for r in answer_run(load_run(no_gpu_run)).display_rows():
        assert all(f">{html_escape(v)}<" in box for v in r.values()), r
    assert "nan" not in box.lower()
    v = ModelValidation(n=12, gmae=0.21, mape=0.25, coverage=0.58, source="public measurements")
    box = report_html([no_gpu_run], validation=v)
    assert "GMAE is 21% on 12 public measurements, 58% of them inside its band" in box


def test_the_headline_beside_the_paper_only_for_its_configuration(no_gpu_html):
    head = panel_html(no_gpu_html, "s1-headline")
    assert "up to +103%" in head and "<figure" in head   # the paper run: its claims, and the chart with bands


def test_provenance_is_said_once_per_section(no_gpu_html):
    html = no_gpu_html
    sec = html[html.index('id="s1-sec-workload-locality"'):html.index('id="s1-locality"')]
    assert "Source of every panel below" in sec and "trace analysis" in sec
    assert 'class="badges"' not in panel_html(html, "s1-locality")
    # a section whose panels differ keeps each panel's own badges
    assert 'class="badges"' in panel_html(html, "s1-headline")


def test_memory_columns_are_honest_in_the_report(small_run):
    """An A40-like kernel: DRAM read 28 KB next to 43 MB written, L2 hit 100.1%, no L1 traffic."""
    run = load_run(small_run)
    m = hostile_metrics(run.name, "base", "void chz_base_kernel<false>(const float *)", "chz_base_kernel")
    set_to = {"dram__bytes_read.sum": 28e3, "dram__bytes_write.sum": 43e6, "lts__t_sector_hit_rate.pct": 100.1,
              "lts__t_sectors.sum": 5e5, "l1tex__t_sector_hit_rate.pct": 0.0,
              "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 0.0,
              "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": 0.0}
    m = m[~m["metric"].isin(set_to)]
    extra = pd.DataFrame([{**m.iloc[0].to_dict(), "metric": k, "value": v, "unit": ""} for k, v in set_to.items()])
    run.metrics = pd.concat([m, extra], ignore_index=True)
    html = report_html([run], strict=True)
    kernels = panel_html(html, "s1-kernels")
    assert "27.3 KiB" in kernels and "41.0 MiB" in kernels and "DRAM written" in kernels
    assert "100.0%*" in kernels and "ncu reported 100.10%" in kernels and "no traffic" in kernels
    memory = panel_html(html, "s1-memory")
    assert "100.0%*" in memory and "no traffic" in memory and "artifact of its sector accounting" in memory


@pytest.fixture(scope="module")
def sglang_html() -> str:
    """The report of a real H800 Nsight Compute file, rendered once for the tests that only read it."""
    path = fixtures_dir() / "h800_sglang.ncu-rep"
    if not path.is_file():
        pytest.skip(f"real Nsight Compute reports not found in {path.parent} (they live beside the repository)")
    return report_html([path], strict=True)


def test_rules_are_a_ranked_matrix_beside_their_sections(sglang_html):
    html = sglang_html
    rules = panel_html(html, "s1-rules")
    assert "finding(s) x 5 kernel(s), ranked" in rules and "est. speedup, time-weighted" in rules
    first = re.search(r"<tbody>\s*<tr><td[^>]*>([^<]*)</td>", rules).group(1)
    assert first == "Launch Configuration: Tail Effect" or "Tail Effect" in first
    assert "Full text of the" in rules  # the text stays available on demand
    for pid, topic in (("s1-stalls", "Not Selected"), ("s1-memory", "L2 Store Access Pattern"),
                       ("s1-occupancy", "Achieved Occupancy")):
        part = panel_html(html, pid)
        assert "ncu rule findings on this" in part and topic in part, pid


def test_import_first_answer_and_kernel_labels(sglang_html):
    html = sglang_html
    time_ = panel_html(html, "s1-time")
    assert "The kernel that matters is #3 distribution_el…ride_kernel (4 of 4)" in time_
    assert "compute-bound" in time_ and "not selected" in time_
    assert "#4 flash_fwd_kernel" in panel_html(html, "s1-summary")  # named, no values, said so


@pytest.mark.slow
def test_comparison_of_two_reports_matches_kernels(ncu_fixtures):
    a, b = ncu_fixtures / "a100_mistic_msdnew.ncu-rep", ncu_fixtures / "a100_mistic_msdkt23.ncu-rep"
    html = report_html([a, b], strict=True)
    part = panel_html(html, "c1-metrics")
    assert "similar name + launch order" in part and "Unmatched kernels (3)" in part
    box = html[html.index('id="c1-answer"'):]
    box = box[:box.index("</section>")]   # the comparison's answer, in the first box
    assert "one kernel pairs up, #0 nodeByPoint → #0 nodeByPoint5 (1 of 4)" in box and "(-84.7%)" in box
    assert "3 kernel(s) are on one side only" in box and html.index('id="c1-answer"') < html.index('class="panel')
    assert "8,261,907 → 1,266,778 (-84.7%)" in part and "25.1% → 33.5% (+8.4 pt)" in part
    html = report_html([a, b], strict=True, pairs=["nodeByPoint=#2"])
    part = panel_html(html, "c1-metrics")
    assert "manual (--pair)" in part and "#2 nodeByPoint5 (3 of 4)" in part and "nodeByPoint=#2" in part


@pytest.mark.slow
def test_the_dlrm_step_panel_shows_stages_bands_and_the_paper(tmp_path):
    """The committed no-GPU paper run holds e2e.csv: stacked stage bars per phase and a
    table with bands, speedups and the paper's end-to-end figure; a run without it says why."""
    src = Path(__file__).resolve().parents[2] / "profiles" / "static-paper"
    run = tmp_path / "run"
    shutil.copytree(src, run)
    html = report_html([run])
    i = html.index("The whole DLRM step")
    panel = html[i:html.index("</section>", i) if "</section>" in html[i:] else i + 200_000]
    assert panel.count("data:image/png;base64,") >= 2          # inference and training
    assert "speedup end to end" in panel and "1.77x end to end" in panel and "band (µs)" in panel
    (run / "e2e.csv").unlink()
    assert "no e2e.csv in the run directory" in report_html([run])


def test_a_panel_is_compacted_for_a_reader_and_loses_nothing():
    """Cold-mode repeats folded behind the steady ones, a long table beside a figure folded
    under its caption, two figures side by side, a short table and a note left in place; a
    panel without a figure is left as it is."""
    from characterize.report.blocks import (
        FOLD_ROWS,
        Cell,
        DetailsBlock,
        FigureBlock,
        FigureRow,
        NoteBlock,
        TableBlock,
        compact,
    )

    def fig(title):
        return FigureBlock(title, "data:image/png;base64,", 800, 340, title, "")

    def tab(caption, n):
        return TableBlock(["a"], [[Cell(str(i))] for i in range(n)], caption=caption)

    long, short, note = tab("steady: latency", FOLD_ROWS + 3), tab("few", FOLD_ROWS), NoteBlock("n")
    blocks = [fig("Latency (steady)"), long, fig("Speedup (steady)"), short, note,
              fig("Latency (cold)"), tab("cold: latency", 30)]
    out = compact(blocks)
    assert isinstance(out[0], FigureRow) and [f.title for f in out[0].figures] == ["Latency (steady)",
                                                                                  "Speedup (steady)"]
    assert isinstance(out[1], DetailsBlock) and out[1].blocks == [long] and "(9 rows)" in out[1].summary
    assert out[2] is short and out[3] is note
    cold = out[4]
    assert isinstance(cold, DetailsBlock) and cold.summary.startswith("Cold mode")
    assert [type(b).__name__ for b in cold.blocks] == ["FigureBlock", "DetailsBlock"]
    plain = [long, note]
    assert compact(plain) == plain
