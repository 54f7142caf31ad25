"""The worker, in process: what a bench point writes on the CPU-emulation backend,
and how bad input ends (a failed point, never a lost one)."""

from __future__ import annotations

import numpy as np

from characterize.measure.worker import main, nvtx_name
from characterize.pipeline import load_experiment, open_experiment_run
from characterize.store import load_run
from tests.conftest import write_experiment


def _run(tmp_path, datasets=("medium",), variants=("base", "warp")):
    exp = load_experiment(str(write_experiment(tmp_path, datasets=datasets, variants=variants, max_reps=3)))
    run = open_experiment_run(exp, tmp_path / "run", "bench", False, None, backend="emulate")
    return exp, run.path


def test_bench_points_are_written_with_their_statistics(tmp_path):
    _, out = _run(tmp_path)
    assert main(["bench", str(out), "--point", "base:medium", "--point", "warp:medium", "--backend", "emulate"]) == 0
    run = load_run(out)
    bench = run.bench
    assert sorted(bench["variant"]) == ["base", "warp"] and (bench["status"] == "ok").all()
    for point in run.points("bench"):
        steady = point["summary"][0]
        assert steady["mode"] == "steady" and steady["reps"] >= 3
        assert np.isfinite(steady["per_table_us"]) and steady["per_table_us"] > 0
    assert not (out / "points" / "bench" / ".inflight").exists()


def test_a_trace_with_bad_indices_fails_its_points_and_names_the_index(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n5000\n3\n")   # E = 1009 in the tiny experiment
    _, out = _run(tmp_path, datasets=("medium", str(bad)), variants=("base",))
    assert main(["bench", str(out), "--point", f"base:{bad}", "--point", "base:medium", "--backend", "emulate"]) == 0
    run = load_run(out)
    assert run.failures["error"].str.contains("5000").all() and len(run.failures) == 1
    assert (run.bench[run.bench["dataset"] == "medium"]["status"] == "ok").all()


def test_an_unknown_variant_is_a_failed_point_not_a_crash(tmp_path):
    _, out = _run(tmp_path, variants=("base",))
    assert main(["bench", str(out), "--point", "nonesuch:medium", "--backend", "emulate"]) == 0
    assert "unknown variant" in load_run(out).failures["error"].iloc[0]


def test_nvtx_names_follow_the_extract_convention():
    from characterize.extract.schema import parse_nvtx_convention

    assert parse_nvtx_convention(nvtx_name("rpf", "medium", 3)) == ("rpf", "medium", 3)
