"""Run directories: created once, resumed on request, written atomically, read back."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from characterize.errors import RunDirError
from characterize.rundir import artifact
from characterize.store import RunDir, list_runs, load_run, point_key, write_atomic


def test_create_refuses_to_overwrite_and_resume_keeps_points(tmp_path):
    run = RunDir.create(tmp_path / "r", {"experiment": {"name": "x"}, "command_line": "first"})
    run.write_point("bench", "base", "medium", {"status": "ok", "summary": []})
    with pytest.raises(RunDirError, match="--resume"):
        RunDir.create(tmp_path / "r", {"experiment": {"name": "x"}})
    again = RunDir.create(tmp_path / "r", {"command_line": "second", "new_key": 1}, resume=True)
    meta = json.loads((again.path / "meta.json").read_text())
    assert meta["command_line"] == "second" and meta["new_key"] == 1 and len(meta["resumed"]) == 1
    assert again.has_point("bench", "base", "medium")


def test_failed_or_torn_points_are_not_finished(tmp_path):
    run = RunDir.create(tmp_path / "r", {})
    run.write_point("bench", "rpf", "low", {"status": "failed", "error": "boom"})
    assert not run.has_point("bench", "rpf", "low")
    run.point_path("bench", "warp", "low").write_text("{not json")
    assert not run.has_point("bench", "warp", "low")
    assert not run.has_point("bench", "base", "low")


def test_point_keys_are_file_safe():
    assert point_key("base", "/data/trace 1.npz") == "base___data_trace_1.npz"


def test_write_atomic_leaves_no_temporary(tmp_path):
    target = tmp_path / "a" / "t.csv"
    write_atomic(target, "x,y\n1,2\n")
    write_atomic(target, b"x,y\n3,4\n")
    assert target.read_text() == "x,y\n3,4\n"
    assert [p.name for p in target.parent.iterdir()] == ["t.csv"]


def test_tables_and_points_read_back(tmp_path):
    run = RunDir.create(tmp_path / "r", {"experiment": {"name": "x"}})
    run.write("static", pd.DataFrame({"variant": ["base"], "registers": [54]}))
    run.write_point("bench", "base", "medium", {"status": "failed", "error": "no GPU"})
    r = load_run(run.path)
    assert r.static[["variant", "registers"]].to_dict("records") == [{"variant": "base", "registers": 54}]
    assert list(r.static.columns) == artifact("static").column_names   # declared order, missing ones empty
    assert len(r.points("bench")) == 1 and r.failures["error"].tolist() == ["no GPU"]
    assert r.predictions.empty and r.bench.empty
    assert list_runs(tmp_path) == [run.path]


def test_a_column_the_run_directory_does_not_declare_is_refused(tmp_path):
    run = RunDir.create(tmp_path / "r", {"experiment": {"name": "x"}})
    with pytest.raises(ValueError, match="not declared in characterize.rundir"):
        run.write("predictions", pd.DataFrame({"variant": ["base"], "made_up_us": [1.0]}))
    assert not (run.path / "predictions.csv").exists()


def test_load_run_names_what_is_wrong(tmp_path):
    with pytest.raises(RunDirError, match="no such run directory"):
        load_run(tmp_path / "missing")
    (tmp_path / "f.ncu-rep").write_bytes(b"x")
    with pytest.raises(RunDirError, match="characterize import"):
        load_run(tmp_path / "f.ncu-rep")
    with pytest.raises(RunDirError, match="not a run directory"):
        load_run(tmp_path)
    (tmp_path / "meta.json").write_text("{")
    with pytest.raises(RunDirError, match="not valid JSON"):
        load_run(tmp_path)


def test_runs_that_complete_each_other_merge_and_two_versions_of_one_stay_apart():
    """The H200 bench run and the profile run of other points read as one; a run beside
    itself, or two runs without measurements, are versions to compare, not halves."""
    from pathlib import Path

    from characterize.store import MergedRun, complementary, load_runs

    root = Path(__file__).resolve().parents[1] / "profiles"
    bench, prof, nogpu = root / "h200" / "paper-gpu", root / "h200" / "paper-gpu-profile", root / "static-paper"
    (merged,) = load_runs([bench, prof])
    assert isinstance(merged, MergedRun) and len(merged.points("profile")) == 9
    assert [r.path for r in load_runs([bench, bench])] == [bench, bench]
    assert len(load_runs([nogpu, nogpu])) == 2 and not complementary([load_run(nogpu)], load_run(nogpu))


def test_a_report_without_its_point_file_is_said_not_dropped():
    """The H200 profile run stopped while optmt's report was written: no point names it, so it
    is not read as a measurement, but the failures list it with what to do."""
    from pathlib import Path

    run = load_run(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "paper-gpu-profile")
    (orphan,) = run.orphan_reports
    assert (orphan["variant"], orphan["dataset"]) == ("optmt", "random") and "--resume" in orphan["error"]
    assert any(e.startswith("ncu/optmt__random.ncu-rep has no point file") for e in run.failures["error"])
    assert "optmt" not in set(run.metrics["variant"])
