"""Orchestration without a GPU: the bench harness on the CPU-emulation backend, and the
profile stage driven through a stand-in ncu that runs the real target program and
returns a real report recorded on a GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from characterize.cli import main
from characterize.measure.ncu import build_argv, cache_argv, export_path
from characterize.measure.runner import ncu_options
from characterize.measure.worker import KERNEL_FILTER
from characterize.pipeline import load_experiment
from characterize.store import load_run
from tests.conftest import HAS_GPU, write_experiment

H200 = Path(__file__).resolve().parents[2] / "profiles" / "h200"


def experiment(tmp_path: Path, datasets=("medium", "random"), modes=("steady",)) -> Path:
    return write_experiment(tmp_path, datasets=datasets, modes=modes)


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "characterize.cli", *map(str, args)], capture_output=True, text=True)


# ---------------------------------------------------------------------- bench
@pytest.mark.slow
def test_bench_writes_every_point_and_resume_skips_them(tmp_path):
    exp = experiment(tmp_path, modes=("steady", "cold"))
    out = tmp_path / "run"
    r = cli("bench", exp, "--backend", "emulate", "--out", out)
    assert r.returncode == 0, r.stderr
    run = load_run(out)
    assert run.meta["experiment"]["name"] == "tiny" and "bench" in run.meta["command_line"]
    assert run.meta["environment"]["torch"] and run.meta["backend"] == "emulate"
    b = run.bench
    assert len(b) == 6 * 2 * 2 and set(b["mode"]) == {"steady", "cold"} and (b["status"] == "ok").all()
    assert (b["per_table_us"] > 0).all() and {"ci95_us", "effective_GBps", "hbm_pct", "reps"} <= set(b.columns)
    l2p = b[(b["variant"] == "l2p")]
    assert (l2p["prepass_per_table_us"] > 0).all() and (l2p["per_table_incl_prepass_us"] > l2p["per_table_us"]).all()
    t = run.timings
    assert {"variant", "dataset", "mode", "rep", "kernel_us", "prepass_us"} <= set(t.columns)
    assert len(t) >= 6 * 2 * 2 * 3  # every repetition kept
    assert "speedup_vs_base" in r.stdout and "CPU-emulation" in r.stdout
    before = {p.name: p.read_text() for p in (out / "points" / "bench").glob("*.json")}
    again = cli("bench", exp, "--backend", "emulate", "--out", out)
    assert again.returncode == 8 and "--resume" in again.stderr
    resumed = cli("bench", exp, "--backend", "emulate", "--out", out, "--resume")
    assert resumed.returncode == 0 and "0 point(s) to time" in resumed.stderr
    assert {p.name: p.read_text() for p in (out / "points" / "bench").glob("*.json")} == before


@pytest.mark.slow
def test_a_failing_point_is_recorded_and_the_rest_continue(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\n5000\n")  # 5000 is outside E=1009
    exp = experiment(tmp_path, datasets=("medium", str(bad)))
    out = tmp_path / "run"
    r = cli("bench", exp, "--backend", "emulate", "--out", out)
    assert r.returncode == 13 and "6 of 12 bench point(s) failed" in r.stderr.splitlines()[-1], r.stderr
    run = load_run(out)
    failed = run.failures
    assert len(failed) == 6 and set(failed["dataset"]) == {str(bad)}
    assert failed["error"].str.contains("index 5000").all()
    assert (run.bench[run.bench["dataset"] == "medium"]["status"] == "ok").sum() == 6


def _worker_pids(parent: int) -> list[int]:
    """PIDs of the bench workers that `parent` (a process this test started) spawned."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == parent and b"characterize.measure.worker" in cmd:
                pids.append(int(d.name))
    return pids


def _wait_for_points(path: Path, n: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(list((path / "points" / "bench").glob("*.json"))) >= n:
            return
        time.sleep(0.05)
    raise AssertionError("no progress")


@pytest.mark.slow
def test_kill_leaves_a_valid_partial_run_and_resume_finishes_it(tmp_path):
    exp = experiment(tmp_path, datasets=("medium", "random", "high"))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "characterize.cli", "bench", str(exp), "--backend", "emulate",
                             "--out", str(out)], start_new_session=True, stderr=subprocess.DEVNULL)
    _wait_for_points(out, 2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run = load_run(out)
    kept = {p.name: p.read_text() for p in (out / "points" / "bench").glob("*.json")}
    assert 2 <= len(kept) < 18 and (run.bench["status"] == "ok").all()
    assert not list((out / "points" / "bench").glob(".*.json.*"))  # no torn temporary files
    r = cli("bench", exp, "--backend", "emulate", "--out", out, "--resume")
    assert r.returncode == 0, r.stderr
    assert f"{18 - len(kept)} point(s) to time" in r.stderr
    final = load_run(out)
    assert len(final.points("bench")) == 18
    for name, text in kept.items():
        assert (out / "points" / "bench" / name).read_text() == text


@pytest.mark.slow
def test_a_stopped_worker_is_found_by_its_heartbeat_long_before_the_point_timeout(tmp_path):
    """A worker stopped with SIGSTOP (as a frozen process would be) stops touching its heartbeat:
    the runner stops it after bench.stall_s (3 s here), far under the 900 s point timeout, records
    the point in flight as failed with the reason, and a fresh worker finishes the others."""
    exp = experiment(tmp_path, datasets=("medium",))
    exp.write_text(exp.read_text().replace("[bench]\n", "[bench]\nstall_s = 3.0\n"))
    out = tmp_path / "run"
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "characterize.cli", "bench", str(exp), "--backend", "emulate",
                             "--out", str(out)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _wait_for_points(out, 1)
    workers = _worker_pids(proc.pid)
    assert workers, "the bench command started no worker"
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    assert proc.wait(timeout=120) == 13
    assert time.monotonic() - start < 120
    run = load_run(out)
    stopped = run.failures
    assert len(stopped) == 1 and "no heartbeat" in stopped["error"].iloc[0], stopped
    assert len(run.points("bench")) == 6 and (run.bench["status"] == "ok").sum() >= 4


@pytest.mark.slow
def test_a_dying_worker_costs_one_point(tmp_path):
    exp = experiment(tmp_path, datasets=("medium", "random"))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "characterize.cli", "bench", str(exp), "--backend", "emulate",
                             "--out", str(out)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _wait_for_points(out, 1)
    # kill while warp (seconds per point in emulation) is being timed, not between two
    # points, when the point .inflight names is already written and nothing is lost
    points, deadline = out / "points" / "bench", time.monotonic() + 120
    while time.monotonic() < deadline:
        key = (points / ".inflight").read_text().strip() if (points / ".inflight").is_file() else ""
        if key.startswith("warp__") and not (points / f"{key}.json").exists():
            break
        time.sleep(0.01)
    workers = _worker_pids(proc.pid)
    assert workers, "the bench command started no worker"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=300) == 13   # every point but the one in flight finished
    run = load_run(out)
    assert len(run.points("bench")) == 12
    died = run.failures
    assert len(died) == 1 and "SIGKILL" in died["error"].iloc[0]


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_bench_without_gpu_says_so(tmp_path):
    r = cli("bench", experiment(tmp_path), "--out", tmp_path / "run")
    assert r.returncode == 4 and "no CUDA device" in r.stderr and "Traceback" not in r.stderr


# -------------------------------------------------------------------- profile
@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """A stand-in ncu (tests/fakes/fake_ncu.py) that returns a real report recorded on an H200:
    base on random and medium, two tables each, under our NVTX names (profiles/h200)."""
    report = H200 / "paper-gpu" / "ncu" / "base.ncu-rep"
    ncu = tmp_path / "bin" / "ncu"
    ncu.parent.mkdir()
    ncu.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).parents[1] / 'fakes' / 'fake_ncu.py'} \"$@\"\n")
    ncu.chmod(0o755)
    log = tmp_path / "ncu-calls.jsonl"
    monkeypatch.setenv("FAKE_NCU_LOG", str(log))
    monkeypatch.setenv("FAKE_NCU_REPORT", str(report))
    monkeypatch.setenv("CHARACTERIZE_BACKEND", "emulate")
    return ncu, log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


@pytest.mark.slow
def test_profile_orchestration_end_to_end(tmp_path, fake_ncu):
    """Every point under one ncu process, then their cache counters in one more under kernel
    replay, kept because ncu needed one pass per kernel; each point reads back its own kernels
    of the shared report (split by launch order and the NVTX names), and a resume redoes nothing."""
    ncu, log = fake_ncu
    exp_path = write_experiment(tmp_path, datasets=("random", "medium"), variants=("base",), tables=2)
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["profile", str(exp_path), "--ncu", str(ncu), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "2 point(s), 4 kernel(s) under one ncu process" in r.output and "about" in r.output
    main_argv, cache = calls(log)
    exp = load_experiment(str(exp_path))
    target = [sys.executable, "-m", "characterize.measure.worker", "profile", str(out), "--point", "base:random",
              "--point", "base:medium", "--backend", "emulate"]
    expected = build_argv(ncu, ncu_options(exp, None), export_path(out / "ncu" / "profile-1"), target)
    assert main_argv == expected[1:]  # the stand-in sees its arguments, not its own path
    assert cache == cache_argv(expected, out / "ncu" / "profile-1.cache", replay_mode="kernel")[1:]
    assert expected[:20] == [str(ncu), "--export", str(out / "ncu" / "profile-1.ncu-rep"), "--force-overwrite",
                             "--config-file", "off", "--cache-control", "none", "--clock-control", "none",
                             "--replay-mode", "kernel", "--target-processes", "all", "--nvtx", "--nvtx-include",
                             "chz-profile/", "--section", "LaunchStats", "--section"]
    assert main_argv[main_argv.index("-k") + 1] == f"regex:{KERNEL_FILTER}"
    run = load_run(out)
    assert run.meta["ncu"]["version"] == "2025.3.1.0"
    pts = {p["dataset"]: p for p in run.points("profile")}
    assert set(pts) == {"random", "medium"} and all(p["status"] == "ok" for p in pts.values())
    assert pts["random"]["report_positions"] == [0, 1] and pts["medium"]["report_positions"] == [2, 3]
    assert all(p["tables_per_launch"] == 1 and p["cache_replay_mode"] == "kernel, 1 pass" for p in pts.values())
    log_text = (out / "ncu" / "profile-1.log").read_text()
    assert "NVTX push chz/base/random/1" in log_text and "NVTX push chz/base/medium/0" in log_text
    m = run.metrics
    assert set(m["dataset"]) == {"medium", "random"}
    hit = m[m["metric"] == "lts__t_sector_hit_rate.pct"]
    assert len(hit) == 4 and (hit["replay_mode"] == "kernel, 1 pass").all()
    k = run.kernels
    assert len(k) == 4 and sorted(k.groupby("dataset").size().items()) == [("medium", 2), ("random", 2)]
    again = CliRunner().invoke(main, ["profile", str(exp_path), "--ncu", str(ncu), "--out", str(out), "--resume"])
    assert again.exit_code == 0 and len(calls(log)) == 2  # nothing redone


@pytest.mark.slow
def test_cache_counters_that_need_several_passes_are_collected_again_under_application_replay(
        tmp_path, fake_ncu, monkeypatch):
    ncu, log = fake_ncu
    monkeypatch.setenv("FAKE_NCU_PASSES", "3")
    exp_path = write_experiment(tmp_path, datasets=("random", "medium"), variants=("base",), tables=2)
    r = CliRunner().invoke(main, ["profile", str(exp_path), "--ncu", str(ncu), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    modes = [a[a.index("--replay-mode") + 1] for a in calls(log)]
    assert modes == ["kernel", "kernel", "application"]
    pts = load_run(tmp_path / "run").points("profile")
    assert all(p["replay_modes"]["dram__bytes_read.sum"] == "application" for p in pts)
    assert "collecting them again under application replay" in (tmp_path / "run" / "log.txt").read_text()


@pytest.mark.slow
def test_points_a_shared_report_cannot_attribute_are_profiled_one_by_one(tmp_path, fake_ncu):
    """The stand-in's report holds 4 kernels; base and l2p on two datasets launch 6 in the
    shared process (l2p: pre-pass and lookup): the points are then profiled one process each."""
    ncu, log = fake_ncu
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["profile", str(experiment(tmp_path)), "--ncu", str(ncu), "--out", str(out),
                                  "--variants", "base,l2p"])
    assert r.exit_code == 0, r.output
    argvs = calls(log)
    assert argvs[0].count("--point") == 4 and len(argvs) == 1 + 4 * 2
    assert [a.count("--point") for a in argvs[1:]] == [1] * 8
    assert "profiling the points one by one" in (out / "log.txt").read_text()
    assert len(load_run(out).points("profile")) == 4


def test_profile_permission_error_is_explained_and_stops(tmp_path, fake_ncu, monkeypatch):
    ncu, log = fake_ncu
    monkeypatch.setenv("FAKE_NCU_MODE", "perm")
    r = CliRunner().invoke(main, ["profile", str(experiment(tmp_path)), "--ncu", str(ncu), "--out",
                                  str(tmp_path / "run")])
    assert r.exit_code == 6 and "ERR_NVGPUCTRPERM" in r.output and "NVreg_RestrictProfilingToAdminUsers" in r.output
    assert len(calls(log)) == 1  # no point in trying the others


@pytest.mark.slow
def test_profile_falls_back_to_launch_order_when_nvtx_matches_nothing(tmp_path, fake_ncu, monkeypatch):
    ncu, log = fake_ncu
    monkeypatch.setenv("FAKE_NCU_MODE", "nvtx-mismatch")
    r = CliRunner().invoke(main, ["profile", str(experiment(tmp_path, datasets=("high",))), "--ncu", str(ncu),
                                  "--out", str(tmp_path / "run"), "--variants", "l2p"])
    assert r.exit_code == 0, r.output
    first, second, cache = calls(log)
    assert "--nvtx-include" in first and "--nvtx-include" not in second
    assert cache[cache.index("--metrics") + 2:cache.index("--launch-count")] == second[second.index("--launch-skip"):
                                                                                       second.index("--launch-count")]
    skip = second[second.index("--launch-skip") + 1]
    # every launch the -k filter matches before the profiled ones: the check (T=2 tables x (pre-pass +
    # lookup + the float64 reference, torch's EmbeddingBag kernel)), then 1 warm-up batch x 2 tables x 2
    assert skip == str(2 * (2 + 1) + 1 * 2 * 2)
    assert second[second.index("--launch-count") + 1] == str(1 * 2)   # 1 profiled table: pre-pass + lookup
    point = load_run(tmp_path / "run").points("profile")[0]
    assert point["scoping"] == "launch-skip" and point["launch_skip"] == 10


@pytest.mark.slow
def test_profile_point_failure_is_recorded_and_others_continue(tmp_path, fake_ncu, monkeypatch):
    ncu, log = fake_ncu
    monkeypatch.setenv("FAKE_NCU_MODE", "crash")
    r = CliRunner().invoke(main, ["profile", str(experiment(tmp_path)), "--ncu", str(ncu), "--out",
                                  str(tmp_path / "run"), "--variants", "base"])
    assert r.exit_code == 13 and "2 failed" in r.output and "every one of the 2 of 2 profile point(s)" in r.output
    pts = load_run(tmp_path / "run").points("profile")
    assert len(pts) == 2 and all(p["status"] == "failed" and p["error"] for p in pts)


def test_profile_without_ncu_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    r = CliRunner().invoke(main, ["profile", str(experiment(tmp_path)), "--ncu", str(tmp_path / "nope")])
    assert r.exit_code == 6 and "ncu" in r.output and "Traceback" not in r.output


# --------------------------------------------------------------------- import
def test_import_fixture_to_csv_and_parquet(tmp_path, ncu_fixtures):
    rep = ncu_fixtures / "a100_mistic_msdnew.ncu-rep"
    r = CliRunner().invoke(main, ["import", str(rep), "-o", str(tmp_path / "x.csv")])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(tmp_path / "x.csv")
    v = dict(zip(df["metric"], df["value"]))
    assert round(v["sm__warps_active.avg.pct_of_peak_sustained_active"], 2) == 80.59
    assert round(v["lts__t_sector_hit_rate.pct"], 2) == 54.11
    assert v["launch__registers_per_thread"] == 32 and v["gpu__time_duration.sum"] == 8261906816
    assert {"kernel_id", "kernel_name", "nvtx_range", "grid", "block", "device", "metric", "unit", "value",
            "run", "variant", "dataset", "table"} <= set(df.columns)
    r = CliRunner().invoke(main, ["import", str(rep), "-o", str(tmp_path / "x.parquet"), "--wide"])
    assert r.exit_code == 0 and pd.read_parquet(tmp_path / "x.parquet")["duration_ns"].iloc[0] == 8261906816
    shown = CliRunner().invoke(main, ["import", str(ncu_fixtures / "h800_sglang.ncu-rep")])
    assert shown.exit_code == 0 and "flash_fwd_kernel" in shown.output


def test_import_corrupt_report(tmp_path, ncu_fixtures):
    raw = (ncu_fixtures / "a100_mistic_msdkt23.ncu-rep").read_bytes()
    (tmp_path / "cut.ncu-rep").write_bytes(raw[:1000])
    r = CliRunner().invoke(main, ["import", str(tmp_path / "cut.ncu-rep")])
    assert r.exit_code == 7 and "cut.ncu-rep" in r.output and "Traceback" not in r.output


# ------------------------------------------------------------- on a real GPU
@pytest.mark.gpu
def test_real_bench_and_profile_of_two_variants(tmp_path):
    from characterize.errors import NcuNotFound
    from characterize.measure.ncu import find_ncu

    try:
        ncu = find_ncu()
    except NcuNotFound as e:
        pytest.skip(str(e))
    exp = experiment(tmp_path, datasets=("medium",))
    out = tmp_path / "run"
    r = cli("bench", exp, "--variants", "base,warp", "--out", out)
    assert r.returncode == 0, r.stderr
    p = cli("profile", exp, "--variants", "base,warp", "--out", out, "--ncu", ncu, "--resume")
    assert p.returncode == 0, p.stderr + p.stdout
    run = load_run(out)
    assert (run.bench["status"] == "ok").all() and run.meta["gpu"]["name"]
    k = run.kernels
    assert set(k["variant"]) == {"base", "warp"} and k["l2_hit_rate_pct"].notna().all()
    assert k["nvtx_range"].str.startswith("chz/").all()  # variant/dataset/table came from NVTX


@pytest.mark.slow
def test_a_variant_that_fails_its_check_is_a_failed_profile_point_with_the_reason(tmp_path, fake_ncu):
    ncu, log = fake_ncu
    r = CliRunner().invoke(main, ["profile", str(experiment(tmp_path, datasets=("medium",))), "--ncu", str(ncu),
                                  "--out", str(tmp_path / "run"), "--variants", "wrong,base"])
    assert r.exit_code == 13 and "1 failed" in r.output, r.output
    pts = {p["variant"]: p for p in load_run(tmp_path / "run").points("profile")}
    assert pts["wrong"]["status"] == "failed" and "does not match torch" in pts["wrong"]["error"]
    assert "not profiled" in pts["wrong"]["error"] and pts["base"]["status"] == "ok"


def test_a_report_shared_by_several_points_is_split_by_launch_order_and_nvtx():
    """One ncu process for several points: each point's kernels by position (the target
    profiles the points in order), checked against the variant and dataset NVTX named, and
    each point reads back only its own kernels. A real H200 report of base on random and
    medium, two tables each (profiles/h200)."""
    from characterize.extract.ncu_rep import read_report
    from characterize.measure.runner import split_points
    from characterize.store import _at_positions

    kernels = read_report(H200 / "paper-gpu" / "ncu" / "base.ncu-rep")
    ids = list(pd.unique(kernels["kernel_id"]))
    points = [("base", "random"), ("base", "medium")]
    parts = split_points(kernels, points, [2, 2])
    assert parts == {("base", "random"): [0, 1], ("base", "medium"): [2, 3]}
    assert set(_at_positions(kernels, parts[("base", "medium")])["kernel_id"]) == set(ids[2:])
    assert split_points(kernels, points, [2, 1]) is None                                  # not what the target made
    assert split_points(kernels, points[::-1], [2, 2]) is None                            # NVTX disagrees
    assert split_points(kernels, [("warp", "random"), ("base", "medium")], [2, 2]) is None
    unnamed = kernels.assign(dataset="", variant="")                                       # launch order alone
    assert split_points(unnamed, points[::-1], [1, 3]) == {("base", "medium"): [0], ("base", "random"): [1, 2, 3]}


@pytest.mark.slow
def test_a_point_file_that_is_not_a_point_is_measured_again_naming_it(tmp_path):
    exp = experiment(tmp_path, datasets=("random",))
    out = tmp_path / "run"
    assert cli("bench", exp, "--backend", "emulate", "--out", out, "--variants", "base").returncode == 0
    (out / "points" / "bench" / "base__random.json").write_text("[]")
    r = cli("bench", exp, "--backend", "emulate", "--out", out, "--variants", "base", "--resume")
    assert r.returncode == 0, r.stderr
    assert "bench base random:" in r.stderr and "base__random.json" in r.stderr and "measured again" in r.stderr
    assert "1 point(s) to time" in r.stderr and load_run(out).points("bench")[0]["status"] == "ok"


@pytest.mark.slow
def test_when_ncu_refuses_the_collection_the_same_way_twice_the_rest_is_not_tried(tmp_path, fake_ncu, monkeypatch):
    """ncu failing with the same error for two points (a metric the GPU lacks, an option it
    refuses) fails the points left without starting ncu for each."""
    ncu, log = fake_ncu
    monkeypatch.setenv("FAKE_NCU_MODE", "badmetric")
    r = CliRunner().invoke(main, ["profile", str(experiment(tmp_path)), "--ncu", str(ncu), "--out",
                                  str(tmp_path / "run"), "--variants", "base,warp,rpf"])
    assert r.exit_code == 13, r.output
    assert len(calls(log)) == 1 + 2   # the shared process, then two points alone
    failures = load_run(tmp_path / "run").failures
    assert len(failures) == 6 and failures["error"].str.contains("Failed to find metric").all()
