"""The pipeline: experiments checked against the registries, and a whole no-GPU run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from characterize import pipeline
from characterize.config import ExperimentConfig, WorkloadConfig
from characterize.errors import ConfigError, UnsupportedShape
from characterize.hardware.devices import devices
from characterize.kernels.registry import VARIANT_ORDER, built_in
from characterize.store import load_run
from characterize.workloads.presets import HOTNESS_ORDER
from tests.analysis.test_model import sass, static
from tests.conftest import needs_tools, write_experiment


def test_empty_lists_mean_everything_in_registry_order():
    exp = pipeline.check_experiment(ExperimentConfig())
    assert exp.variants == VARIANT_ORDER and exp.datasets == HOTNESS_ORDER


@pytest.mark.parametrize("change, message", [
    ({"variants": ("base", "nonesuch")}, "unknown variant 'nonesuch'"),
    ({"datasets": ("tepid",)}, "tepid"),
    ({"archs": ("sm_75",)}, "sm_75"),
    ({"params": {"rpf": {"Q": 1}}}, "no parameter"),
])
def test_names_are_checked_against_the_registries(change, message):
    with pytest.raises(ConfigError, match=message):
        pipeline.check_experiment(dataclasses.replace(ExperimentConfig(), **change))


def test_a_variant_that_cannot_run_D_is_refused_by_name():
    exp = ExperimentConfig(workload=WorkloadConfig(D=30), variants=("base", "warp"))
    with pytest.raises(UnsupportedShape, match="warp"):
        pipeline.check_experiment(exp)


def test_shipped_experiments_load():
    for name in ("paper", "quick", "selftest"):
        assert pipeline.load_experiment(name).name == name
    with pytest.raises(ConfigError, match="available: paper, quick, selftest"):
        pipeline.load_experiment("nope")


def test_predict_reuses_static_rows_that_cover_it(monkeypatch):
    exp = pipeline.load_experiment("quick")
    called = []
    monkeypatch.setattr(pipeline.predictions, "code_facts", lambda *a, **k: called.append(a))
    code = pipeline.CodeFacts(exp.workload.D, static(), sass())   # the committed run's real facts
    pipeline.predict(exp, ["sm_80"], code=code)
    assert not called


@pytest.mark.slow
@pytest.mark.skipif(bool(devices()), reason="checks the no-GPU path")
def test_a_run_without_a_gpu_characterizes_statically_and_reports(tmp_path):
    exp = pipeline.load_experiment(str(write_experiment(tmp_path, variants=("base", "optmt", "warp"))))
    outcome = pipeline.run_experiment(exp, tmp_path / "run")
    assert outcome.steps["static"] == "done" and outcome.steps["predict"] == "done"
    assert outcome.steps["bench"].startswith("skipped: no CUDA GPU")
    run = load_run(outcome.path)
    assert set(run.static["variant"]) == {"base", "optmt", "warp"}
    assert set(run.sass["variant"]) == {"base", "optmt", "warp"} and (run.sass["local_mem_ops"] == 0).all()
    assert set(run.predictions["variant"]) >= {"base", "optmt", "warp"}
    assert len(run.model_validation) >= 4
    assert outcome.report is not None and outcome.report.is_file()


def test_the_e2e_step_reuses_the_runs_predictions_and_they_give_the_same_step(monkeypatch):
    exp = dataclasses.replace(pipeline.load_experiment("quick"), variants=("base", "warp"), dtypes=("fp16",))
    emb = pipeline.predict(exp)
    fresh = pipeline.e2e(exp, check=False)
    called = []
    monkeypatch.setattr(pipeline.dlrm, "predict", lambda *a, **k: called.append(a))
    reused = pipeline.e2e(exp, check=False, predictions=emb)
    assert not called   # the fp16 rows beside them do not force a second prediction
    pd.testing.assert_frame_equal(reused.rows.reset_index(drop=True), fresh.rows.reset_index(drop=True))
    partial = emb[emb["variant"] != "warp"]
    monkeypatch.undo()
    assert pipeline.dlrm._e2e_embedding(partial, ["base", "warp"], exp.archs, exp.workload.dtype) is None


def test_the_selftest_plan_fits_its_budget_in_the_order_of_value():
    """The plan lists the steps by what each is worth (device check, bench, profile, the DLRM
    step), keeps the report's time aside, and cuts what the budget does not hold, saying why;
    the default budget (8 minutes) holds every step of the selftest experiment on 16 cores."""
    from characterize.config import DTYPES
    from characterize.pipeline import SELFTEST_BUDGET_S, load_experiment, selftest_checks, selftest_plan

    exp = load_experiment("selftest")
    plan = selftest_plan(exp, 16)
    assert [st.name for st in plan.steps] == ["check", "bench", "profile", "e2e", "report"]
    assert all(st.fits for st in plan.steps) and plan.seconds <= SELFTEST_BUDGET_S == 480, plan.lines()
    public = built_in()   # fbgemm is checked where it is installed
    assert plan.step("check").units == len(public) * (len(DTYPES) + 1) and selftest_checks()[-1] == ("mean", "fp32")
    assert plan.step("profile").units == len(exp.variants)
    assert plan.lines()[0].startswith("self-test plan: about")
    small = selftest_plan(exp, 16, budget_s=plan.step("check").seconds + plan.step("report").seconds + 1)
    assert [st.name for st in small.steps if st.fits] == ["check", "report"]
    cut = small.step("bench")
    assert "would take about" in cut.why and any("CUT: would take" in line for line in small.lines())


def test_kept_predictions_and_claims_are_keyed_by_the_whole_package(monkeypatch):
    """The package digest in their keys reads every module and data file of characterize/
    (the model, its corpus, the presets, the spec table), not only the pipeline's folder:
    a change to the model computes them again."""
    roots = []
    monkeypatch.setattr(pipeline.predictions, "source_digest", lambda root, suffixes: roots.append(root) or "")
    pipeline.predictions._package_digest.cache_clear()
    try:
        pipeline.predictions._package_digest()
    finally:
        pipeline.predictions._package_digest.cache_clear()
    [root] = roots
    assert (root / "analysis" / "model" / "predict.py").is_file() and (root / "hardware" / "specs.py").is_file()


@pytest.mark.slow
def test_the_paper_claims_check_is_kept_and_a_damaged_entry_is_computed_again(tmp_path, own_cache, monkeypatch):
    """Every run checks the model against the paper's claims at the paper's size: the
    result is kept (the build cache, keyed by what it depends on) and read back as is."""
    from characterize.analysis.claims import CLAIM_ARCH, CLAIM_VARIANTS

    monkeypatch.setenv("CHARACTERIZE_CALIBRATION", str(tmp_path / "calibration"))
    first = pipeline.model_validation()
    [entry] = (own_cache / "claims").glob("*.csv")
    pd.testing.assert_frame_equal(pipeline.model_validation(), first)
    entry.write_text("")                                             # damaged
    pd.testing.assert_frame_equal(pipeline.model_validation(), first)
    assert entry.stat().st_size > 0 and len(first) == 4
    code = pipeline.code_facts(CLAIM_VARIANTS, [CLAIM_ARCH], 128)
    key = pipeline.predictions._claims_key(code)
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "a100-80gb.json").write_text("{}")   # a stored calibration changes the answer
    assert pipeline.predictions._claims_key(code) != key


@pytest.mark.slow
def test_the_selftest_runs_what_its_budget_holds_and_records_what_it_cut(tmp_path, monkeypatch):
    """Rehearsed on the CPU emulation: a budget that holds the bench and the report but not the
    device check, the profile or the DLRM step runs those two, records every step's outcome,
    estimate and time in selftest.json (the cuts with why), and archives the run beside it."""
    import json
    import os

    from characterize.pipeline import load_experiment, selftest_gpu, selftest_plan
    from tests.conftest import write_experiment

    exp_path = write_experiment(tmp_path, variants=("base", "warp"), datasets=("medium",))
    plan = selftest_plan(load_experiment(str(exp_path)), os.cpu_count() or 1)
    budget = plan.step("bench").seconds + plan.step("report").seconds + 1
    assert plan.step("check").seconds > budget   # the test's premise: the check is cut
    lines: list[str] = []
    out = selftest_gpu(tmp_path / "run", experiment=str(exp_path), backend="emulate", budget_s=budget,
                       progress=lines.append)
    record = json.loads((tmp_path / "run" / "selftest.json").read_text())
    status = {k: v["status"] for k, v in record["steps"].items()}
    assert status == {"check": "cut", "bench": "done", "profile": "cut", "e2e": "cut", "report": "done"}, record
    assert "would take about" in record["steps"]["check"]["note"]
    assert record["steps"]["bench"]["planned_s"] == round(plan.step("bench").seconds, 1)
    assert lines[0].startswith("self-test plan: about") and any("CUT:" in line for line in lines[:6])
    assert out.archive == tmp_path / "run.tar.gz" and out.archive.stat().st_size > 0
    assert (tmp_path / "run" / "report.html").is_file() and not out.checks
    assert any(p.startswith("check: cut") for p in out.problems)


@pytest.mark.slow
def test_a_run_measured_on_a_gpu_gets_its_predictions_on_a_machine_without_one(tmp_path):
    """`run --resume` of the committed H200 run on a machine without a GPU adds the static
    facts, locality, predictions (for the run's H200 too) and the report, keeps every measured
    point as it was, and says bench and profile were measured elsewhere."""
    import shutil

    from click.testing import CliRunner

    from characterize.cli import main
    from characterize.hardware.devices import devices
    from characterize.store import load_run

    if devices():
        pytest.skip("checks the path without a GPU")
    h200 = Path(__file__).resolve().parents[1] / "profiles" / "h200"
    run = tmp_path / "paper-gpu"
    shutil.copytree(h200 / "paper-gpu", run)
    before = {p.name: p.read_text() for p in (run / "points").rglob("*.json")}
    r = CliRunner().invoke(main, ["run", str(h200 / "paper-gpu.toml"), "--out", str(run), "--resume"])
    assert r.exit_code == 0, r.output
    assert "bench: skipped: measured on NVIDIA H200" in r.output and "predict: done" in r.output
    after = load_run(run)
    assert "h200" in set(after.predictions["gpu"]) and (run / "report.html").is_file()
    assert {p.name: p.read_text() for p in (run / "points").rglob("*.json")} == before
    assert r.output.rstrip().splitlines()[-1].startswith("the answer: h200: use tbe")


@needs_tools
def test_the_sweeps_step_adds_the_register_sweep_and_the_grid_after_the_answer(tmp_path, monkeypatch):
    """The static and predict steps hold the workload's dtype alone (the first answer); the
    sweeps step adds the register sweep and each other precision's facts and predictions,
    leaves the answer's rows as they were, and, run again (a resumed run), doubles nothing."""
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path / "cache"))
    exp = dataclasses.replace(pipeline.load_experiment(str(write_experiment(
        tmp_path, datasets=("high",), variants=("base", "warp"), caps=(48,)))), dtypes=("fp16",))
    run = pipeline.open_experiment_run(exp, tmp_path / "run", "bench", False, None)
    code = pipeline.static_step(run, exp)
    assert set(code.static["dtype"]) == {"fp32"} and not code.static["sweep"].any()
    answer = pipeline.predict_step(run, exp, code)
    assert set(answer["dtype"]) == {"fp32"}
    first = load_run(run.path)
    first_predictions, first_sass = first.predictions, first.sass   # read now: a run's tables are read lazily
    pipeline.sweeps_step(run, exp)
    after = load_run(run.path)
    assert set(after.static["dtype"]) == set(after.sass["dtype"]) == {"fp32", "fp16"}
    assert set(after.static.loc[after.static["sweep"], "maxrregcount"]) == {48}
    assert set(after.predictions["dtype"]) == {"fp32", "fp16"}
    kept = after.predictions[after.predictions["dtype"] == "fp32"].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, first_predictions)
    pd.testing.assert_frame_equal(after.sass[after.sass["dtype"] == "fp32"].reset_index(drop=True), first_sass)
    pipeline.sweeps_step(run, exp)
    again = load_run(run.path)
    assert len(again.predictions) == len(after.predictions) and len(again.static) == len(after.static)
    assert len(again.sass) == len(after.sass)


@needs_tools
def test_a_run_measured_elsewhere_is_analyzed_here_without_touching_its_points(tmp_path, monkeypatch):
    """`run --resume` of a run measured on a GPU, on a machine without one: every step that
    needs no GPU runs (the run's GPU predicted too), bench and profile are recorded as kept,
    and the measured points stay byte for byte."""
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path / "cache"))
    if devices():
        pytest.skip("a GPU here would measure the run instead")
    exp = pipeline.load_experiment(str(write_experiment(tmp_path, datasets=("high",), variants=("base", "warp"),
                                                        caps=(48,))))
    run = pipeline.open_experiment_run(exp, tmp_path / "run", "bench", False, None)
    run.update_meta(gpu={"key": "h200", "name": "NVIDIA H200"})
    point = run.point_path("bench", "base", "high")
    point.parent.mkdir(parents=True, exist_ok=True)
    point.write_text('{"variant": "base", "dataset": "high", "status": "ok"}')
    said: list[str] = []
    outcome = pipeline.run_experiment(exp, tmp_path / "run", resume=True, after_step=lambda s, p: said.append(s))
    assert outcome.steps["bench"].startswith("skipped: measured on NVIDIA H200, kept as measured")
    assert outcome.steps["profile"].startswith("skipped: measured on NVIDIA H200")
    assert all(outcome.steps[s] == "done" for s in ("static", "locality", "predict", "e2e", "sweeps", "report"))
    assert said == ["static", "locality", "predict", "e2e", "sweeps", "report"]
    stored = load_run(tmp_path / "run")
    assert "h200" in set(stored.predictions["gpu"]) and stored.static["sweep"].any()
    assert stored.meta["analyzed"]["kernels"] and point.read_text().startswith('{"variant": "base"')
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "analyzed without a GPU (measured on NVIDIA H200)" in log and "sweeps: done (" in log
