"""What makes the first answer fast changes no number: each trace is generated, read and
analyzed once per run whatever the precision, the model's traces are analyzed side by side,
and every library the static characterization and the SASS analysis read is built up front,
in parallel."""

from __future__ import annotations

import pandas as pd
import pytest

from characterize.analysis.model import predict as MP
from characterize.analysis.model.locality import shared_profiles, trace_profile
from characterize.config import WorkloadConfig
from characterize.kernels.build import BuildTally, observe_builds
from characterize.kernels.static import analyze_variants, prebuild, static_characterization
from characterize.workloads.traces import load_dataset, shared_datasets
from tests.analysis.test_model import sass, static
from tests.conftest import needs_tools

WL = WorkloadConfig(T=3, E=1009, D=68, B=127, L="uniform:0:20", batches=3)


def test_a_run_generates_each_trace_once_whatever_the_precision():
    with shared_datasets():
        a = load_dataset("medium", WL, tables=[0])
        assert load_dataset("medium", WL.replace(dtype="fp16", D=64), tables=range(1)) is a
        assert load_dataset("medium", WL.replace(B=129), tables=[0]) is not a   # another trace
    assert load_dataset("medium", WL, tables=[0]) is not a   # outside a run: nothing is kept
    with shared_profiles():
        p = trace_profile("high", WL)
        assert trace_profile("high", WL.replace(dtype="int8")) is p
    assert trace_profile("high", WL) is not p


def test_shared_and_parallel_analysis_predict_the_same_numbers():
    variants, datasets = ["base", "rpf", "l2p", "l2w", "combined"], ["high", "medium", "low"]
    alone = pd.concat([MP.predict(WL.replace(dtype=dt), datasets, variants, ["sm_80", "sm_90"],
                                  static=static().assign(dtype=dt), sass=sass().assign(dtype=dt))
                       for dt in ("fp32", "fp16")], ignore_index=True)
    with shared_datasets(), shared_profiles():
        shared = pd.concat([MP.predict(WL.replace(dtype=dt), datasets, variants, ["sm_80", "sm_90"],
                                       static=static().assign(dtype=dt), sass=sass().assign(dtype=dt))
                            for dt in ("fp32", "fp16")], ignore_index=True)
    pd.testing.assert_frame_equal(alone, shared)


@pytest.mark.slow
@needs_tools
def test_prebuild_asks_for_every_build_the_characterization_reads():
    variants, archs = ["base", "optmt", "rpf", "warp"], ["sm_80"]
    before, after = BuildTally(), BuildTally()
    with observe_builds(before):
        prebuild(variants, archs, ["fp32", "fp16"], sweep_caps=(40, 48))
    with observe_builds(after):
        for dt in ("fp32", "fp16"):
            static_characterization(variants, archs, (40, 48) if dt == "fp32" else (), D=128, dtype=dt)
            analyze_variants(variants, archs, D=128, dtype=dt)
    assert after.seen and after.seen <= before.seen, after.seen - before.seen


@needs_tools
def test_device_code_builds_read_like_the_library():
    """What static characterization and SASS analysis build: the device code alone, whose
    ptxas report and SASS are the shared library's (nvcc skips the host compile and link)."""
    from characterize.kernels.build import BuildSpec, build
    from characterize.kernels.sass import kernels_in

    lib = build(BuildSpec("cuda", "sm_80", 48))
    dev = build(BuildSpec("cuda", "sm_80", 48, output="cubin"))
    assert lib.library.suffix == ".so" and dev.library.name == "chz.cubin" and "-cubin" in dev.command
    assert lib.kernels == dev.kernels   # registers, spills, stack, shared memory of every kernel
    a, b = kernels_in(lib.library), kernels_in(dev.library)
    assert sorted(a) == sorted(b)
    for name in a:
        assert [i.text for i in a[name].instructions] == [i.text for i in b[name].instructions], name
    assert "(device code)" in dev.spec.label() and BuildSpec("emulate", output="cubin").output == "library"


def test_an_experiments_predictions_are_kept_and_recomputed_when_an_input_changes(tmp_path, own_cache, monkeypatch):
    """A second run of the same inputs reads the predictions an earlier one kept (a warm
    `characterize run` does no trace analysis); a trace file rewritten, a damaged entry or
    a stored calibration makes them computed again."""
    import dataclasses
    import json
    import os

    from characterize import pipeline
    from characterize.config import ExperimentConfig
    from characterize.workloads.traces import generate, write_trace

    monkeypatch.setenv("CHARACTERIZE_CALIBRATION", str(tmp_path / "calibration"))
    trace = write_trace(generate("high", WL), tmp_path / "mine.npz")
    exp = pipeline.check_experiment(ExperimentConfig(workload=WL, datasets=("medium", str(trace)),
                                                     variants=("base", "warp"), archs=("sm_80",), dtypes=("fp16",)))
    code = pipeline.CodeFacts(WL.D, pd.concat([static(), static().assign(dtype="fp16")]),
                              pd.concat([sass(), sass().assign(dtype="fp16")]))
    computed = []
    real = pipeline.predictions.model_predictions
    monkeypatch.setattr(pipeline.predictions, "model_predictions", lambda *a, **k: computed.append(1) or real(*a, **k))

    first = pipeline.predict(exp, code=code)
    assert len(computed) == 2 and set(first["dtype"]) == {"fp32", "fp16"}   # one per precision
    kept = pipeline.predict(exp, code=code)
    assert len(computed) == 2
    pd.testing.assert_frame_equal(kept, first)
    assert kept.attrs == first.attrs

    write_trace(generate("random", WL), trace)                    # the same file, new lookups
    os.utime(trace, ns=(1, 1))
    fresh = pipeline.predict(exp, code=code)
    assert len(computed) == 4
    mine = fresh["dataset"] == str(trace)
    assert list(fresh[mine]["time_us"]) != list(first[first["dataset"] == str(trace)]["time_us"])

    for entry in (own_cache / "predictions").glob("*.pkl"):
        entry.write_bytes(entry.read_bytes()[:100])                 # damaged: truncated
    pd.testing.assert_frame_equal(pipeline.predict(exp, code=code), fresh)
    assert len(computed) == 6
    from characterize.analysis.model.constants import ModelConstants
    from characterize.hardware.specs import gpu_spec

    (tmp_path / "calibration").mkdir()                            # a calibration changes the constants
    consts = dataclasses.replace(ModelConstants.defaults(gpu_spec("sm_80")), pinned_hit=0.5)
    (tmp_path / "calibration" / "a100-80gb.json").write_text(json.dumps({"constants": consts.to_dict()}))
    pipeline.predict(exp, code=code)
    assert len(computed) == 8
