"""The worker, in process: what a bench point writes on the CPU-emulation backend,
and how bad input ends (a failed point, never a lost one)."""

from __future__ import annotations

import numpy as np
import pytest

from characterize.measure.worker import main, nvtx_name
from characterize.pipeline import load_experiment, open_experiment_run
from characterize.store import load_run
from tests.conftest import HAS_GPU, write_experiment


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


def test_every_point_is_checked_before_it_is_timed_and_records_how_it_was_timed(tmp_path):
    _, out = _run(tmp_path, variants=("base",))
    assert main(["bench", str(out), "--point", "base:medium", "--backend", "emulate"]) == 0
    point = load_run(out).points("bench")[0]
    assert point["check"]["passed"] and 0 <= point["check"]["max_abs_err"] <= point["check"]["tolerance"]
    assert point["clock_control"] == "none"
    for row in point["summary"]:
        assert row["timing_method"] == "wall-clock-emulation" and row["gap_free"] is False
        assert row["host_launch_us"] > 0 and row["host_bound_reps"] == 0


def test_a_variant_that_does_not_match_torch_is_a_failed_point_with_its_error_never_timed(tmp_path):
    _, out = _run(tmp_path, variants=("wrong", "base"))
    assert main(["bench", str(out), "--point", "wrong:medium", "--point", "base:medium", "--backend", "emulate"]) == 0
    run = load_run(out)
    failed = {p["variant"]: p for p in run.points("bench") if p["status"] == "failed"}
    assert list(failed) == ["wrong"]
    check = failed["wrong"]["check"]
    assert not check["passed"] and check["max_abs_err"] > check["tolerance"] > 0
    assert "does not match torch" in failed["wrong"]["error"] and "not timed" in failed["wrong"]["error"]
    assert "repetitions" not in failed["wrong"]
    assert (run.bench[run.bench["variant"] == "base"]["status"] == "ok").all()


def test_the_profile_target_refuses_a_variant_that_does_not_match_torch(tmp_path, capsys):
    exp = load_experiment(str(write_experiment(tmp_path, datasets=("medium",), variants=("wrong",), max_reps=3)))
    run = open_experiment_run(exp, tmp_path / "run", "profile", False, None, backend="emulate")
    code = main(["profile", str(run.path), "--variant", "wrong", "--dataset", "medium", "--backend", "emulate"])
    err = capsys.readouterr()
    assert code != 0 and "does not match torch" in err.err and "not profiled" in err.err
    assert "NVTX push chz-profile" not in err.out


def _l2p_tables(max_persisting: int, T: int = 2):
    import dataclasses

    import torch

    from characterize.hardware.specs import gpu_spec
    from characterize.kernels.library import bind

    gpu = dataclasses.replace(gpu_spec("a100"), max_persisting_l2_bytes=max_persisting)
    g = torch.Generator().manual_seed(5)
    trace = torch.randint(0, 1009, (400,), generator=g)
    return [bind("l2p", torch.rand(1009, 68, generator=g), trace=trace, params={"K": 97}, backend="emulate", gpu=gpu)
            for _ in range(T)]


def test_l2p_runs_inside_a_persisting_set_aside_sized_for_its_hot_rows_and_restores_it():
    from characterize.measure.worker import l2_set_aside

    kernels = _l2p_tables(max_persisting=1 << 20)
    lib = kernels[0].library
    hot = 97 * 68 * 4
    resets = lib.emu_state().persisting_resets
    with l2_set_aside(kernels, True) as granted:
        assert lib.emu_state().persisting_limit == hot
        assert granted == {"requested_bytes": hot, "granted_bytes": hot, "previous_bytes": 0}
    assert lib.emu_state().persisting_limit == 0 and lib.emu_state().persisting_resets == resets + 1
    # a set-aside smaller than the hot set: the device's maximum is granted, and recorded
    small = _l2p_tables(max_persisting=8192)
    with l2_set_aside(small, True) as granted:
        assert granted["granted_bytes"] == 8192 < granted["requested_bytes"] == hot
    with l2_set_aside(small, False) as granted:   # measured without a set-aside
        assert granted == {} and small[0].library.emu_state().persisting_limit == 0
    with l2_set_aside([bind_base()], True) as granted:   # no pre-pass, no set-aside
        assert granted == {}


def bind_base():
    import torch

    from characterize.kernels.library import bind

    return bind("base", torch.rand(31, 8), backend="emulate")


def test_a_bench_point_of_l2p_records_its_set_aside(tmp_path):
    _, out = _run(tmp_path, variants=("l2p",))
    assert main(["bench", str(out), "--point", "l2p:medium", "--backend", "emulate"]) == 0
    point = load_run(out).points("bench")[0]
    assert point["status"] == "ok" and point["l2_set_aside"]["granted_bytes"] > 0
    assert point["l2_set_aside"]["granted_bytes"] == min(point["l2_set_aside"]["requested_bytes"], 30 << 20)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU: the persisting-L2 limit is the driver's")
def test_on_a_gpu_the_set_aside_is_granted_within_the_device_maximum_and_restored():
    import torch

    from characterize.hardware.devices import devices
    from characterize.kernels.library import bind
    from characterize.measure.worker import l2_set_aside

    g = torch.Generator(device="cuda").manual_seed(5)
    trace = torch.randint(0, 200_003, (50_000,), generator=g, device="cuda")
    kernels = [bind("l2p", torch.rand(200_003, 128, generator=g, device="cuda"), trace=trace, backend="cuda")]
    limit = devices()[0].max_persisting_l2_bytes
    with l2_set_aside(kernels, True) as granted:
        assert 0 < granted["granted_bytes"] <= min(granted["requested_bytes"], limit)
    assert kernels[0].library.l2_set_aside(0)[1] == granted["previous_bytes"]


def test_a_batched_variant_is_timed_one_launch_per_batch_and_reported_per_table(tmp_path, capsys):
    """tbe's batch is one launch: a repetition is that launch, per-table figures are the batch's / T;
    its profile target launches the whole batch once inside the profiled range."""
    exp, out = _run(tmp_path, variants=("tbe",))
    assert main(["bench", str(out), "--point", "tbe:medium", "--backend", "emulate"]) == 0
    point = load_run(out).points("bench")[0]
    assert point["status"] == "ok" and point["check"]["passed"], point.get("error")
    assert point["launch"]["fp32"]["path"] == "long" and point["params"]["index_bits"] == 32
    for row in point["summary"]:
        assert row["launches_per_batch"] == 1
        assert row["per_table_us"] == pytest.approx(row["per_batch_us"] / exp.workload.T)
        assert row["per_table_incl_prepass_us"] == row["per_table_us"] and row["prepass_per_table_us"] == 0
    assert {r["rep"] for r in point["repetitions"] if r["mode"] == "steady"} >= {0, 1, 2}
    prof = open_experiment_run(exp, tmp_path / "prof", "profile", False, None, backend="emulate")
    assert main(["profile", str(prof.path), "--variant", "tbe", "--dataset", "medium", "--backend", "emulate"]) == 0
    said = capsys.readouterr().out
    assert said.count("NVTX push chz/tbe/medium/0") == 1 and "1 launch(es) covering all 2 tables" in said


def test_the_ncu_kernel_filter_matches_the_batched_kernel():
    import re

    from characterize.kernels.registry import get_variant
    from characterize.measure.runner import KERNEL_FILTER, _launches

    assert re.search(KERNEL_FILTER, get_variant("tbe").kernel_name({}, 128))
    assert _launches("tbe", 12) == 1 and _launches("l2p", 12) == 24 and _launches("base", 3) == 3
