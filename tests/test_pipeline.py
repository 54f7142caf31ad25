"""The pipeline: experiments checked against the registries, and a whole no-GPU run."""

from __future__ import annotations

import dataclasses

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
from tests.conftest import write_experiment


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
    monkeypatch.setattr(pipeline, "code_facts", lambda *a, **k: called.append(a))
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
    monkeypatch.setattr(pipeline, "predict", lambda *a, **k: called.append(a))
    reused = pipeline.e2e(exp, check=False, predictions=emb)
    assert not called   # the fp16 rows beside them do not force a second prediction
    pd.testing.assert_frame_equal(reused.rows.reset_index(drop=True), fresh.rows.reset_index(drop=True))
    partial = emb[emb["variant"] != "warp"]
    monkeypatch.undo()
    assert pipeline._e2e_embedding(partial, ["base", "warp"], exp.archs, exp.workload.dtype) is None


def test_the_selftest_is_planned_under_ten_minutes_by_construction():
    """The self-test's plan (upper bounds per step from the experiment's own budgets) fits
    in 10 minutes on a GPU machine's cores; it checks each variant x dtype once (and mean
    mode), and runs one ncu process (plus its cache collection) per variant."""
    from characterize.config import DTYPES
    from characterize.pipeline import SELFTEST_BUDGET_S, load_experiment, selftest_checks, selftest_plan

    exp = load_experiment("selftest")
    for cores in (8, 16):
        plan = selftest_plan(exp, cores)
        assert plan.seconds < SELFTEST_BUDGET_S, plan.lines()
    steps = {name: (n, sec) for name, n, sec, _ in selftest_plan(exp, 16).steps}
    assert steps["profile"][0] == len(exp.variants)   # processes: one per variant, not per point
    public = built_in()   # fbgemm is checked where it is installed
    assert steps["check"][0] == len(public) * (len(DTYPES) + 1) and selftest_checks()[-1] == ("mean", "fp32")
    assert selftest_plan(exp, 16).lines()[0].startswith("self-test plan, at most")


@pytest.mark.slow
def test_the_paper_claims_check_is_kept_and_a_damaged_entry_is_computed_again(tmp_path, monkeypatch):
    """Every run checks the model against the paper's claims at the paper's size: the
    result is kept (the build cache, keyed by what it depends on) and read back as is."""
    from characterize.analysis.claims import CLAIM_ARCH, CLAIM_VARIANTS

    monkeypatch.setattr(pipeline, "cache_root", lambda: tmp_path)   # the claims' cache only
    monkeypatch.setenv("CHARACTERIZE_CALIBRATION", str(tmp_path / "calibration"))
    first = pipeline.model_validation()
    [entry] = (tmp_path / "claims").glob("*.csv")
    pd.testing.assert_frame_equal(pipeline.model_validation(), first)
    entry.write_text("")                                             # damaged
    pd.testing.assert_frame_equal(pipeline.model_validation(), first)
    assert entry.stat().st_size > 0 and len(first) == 4
    code = pipeline.code_facts(CLAIM_VARIANTS, [CLAIM_ARCH], 128)
    key = pipeline._claims_key(code)
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "a100-80gb.json").write_text("{}")   # a stored calibration changes the answer
    assert pipeline._claims_key(code) != key
