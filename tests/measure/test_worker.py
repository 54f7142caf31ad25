"""The worker, in process: what a bench point writes on the CPU-emulation backend,
and how bad input ends (a failed point, never a lost one)."""

from __future__ import annotations

import numpy as np
import pytest

from characterize.measure.worker import main, nvtx_name
from characterize.pipeline import load_experiment, open_experiment_run
from characterize.store import RunDir, load_run
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

    gpu = dataclasses.replace(gpu_spec("a100-80gb"), max_persisting_l2_bytes=max_persisting)
    g = torch.Generator().manual_seed(5)
    trace = torch.randint(0, 1009, (400,), generator=g)
    return [bind("l2p", torch.rand(1009, 68, generator=g), trace=trace, params={"K": 97}, backend="emulate", gpu=gpu)
            for _ in range(T)]


def test_l2p_runs_inside_a_persisting_set_aside_sized_for_its_hot_rows_and_restores_it():
    from characterize.kernels.library import device_state as l2_set_aside

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


def _emulated_device():
    """The process's emulated device (one per process, as a GPU's context), sized as the
    tiny experiment's GPU (sm_80: the A100 entry)."""
    from characterize.hardware.specs import gpu_spec
    from characterize.kernels.build import BuildSpec
    from characterize.kernels.library import load_library

    lib = load_library(BuildSpec("emulate"))
    gpu = gpu_spec("sm_80")
    lib.emu_configure(gpu.l2_bytes, gpu.max_persisting_l2_bytes)
    return lib


def _user_l2_state(lib) -> tuple:
    """Give the device a state of its own before the worker starts: a 4 KiB persisting
    limit and a stream window, as another program on the GPU might have left them."""
    import ctypes

    carve, nbytes, ratio = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_float()
    assert lib.lib.chz_l2_window_apply(None, 0x10000, 4096, ctypes.byref(carve), ctypes.byref(nbytes),
                                       ctypes.byref(ratio)) == 0
    return _l2_state(lib)


def _l2_state(lib) -> tuple:
    s = lib.emu_state()
    return (s.persisting_limit, s.window_base, s.window_bytes, round(s.window_hit_ratio, 6), s.window_hit_prop,
            s.window_miss_prop)


def _four_tables(tmp_path, variants):
    path = write_experiment(tmp_path, datasets=("medium", "high"), variants=variants, max_reps=3)
    path.write_text(path.read_text().replace("T = 2", "T = 4"))
    exp = load_experiment(str(path))
    assert exp.workload.T == 4
    return exp, open_experiment_run(exp, tmp_path / "run", "bench", False, None, backend="emulate").path


def test_a_worker_leaves_the_l2_state_as_it_found_it_after_many_tables_and_variants(tmp_path):
    """l2w on 4 tables, then l2p, combined, warp and l2w again, in one worker: the persisting
    limit and the stream's window are back to what they were before it started (the
    device had a state of its own), and l2w's windows travelled with its launches."""
    exp, out = _four_tables(tmp_path, ("l2w", "l2p", "combined", "warp"))
    lib = _emulated_device()
    before = _user_l2_state(lib)
    launches = lib.emu_state().windowed_launches
    points = ["l2w:medium", "l2p:medium", "combined:medium", "warp:medium", "l2w:high"]
    assert main(["bench", str(out), *[a for p in points for a in ("--point", p)], "--backend", "emulate"]) == 0
    assert _l2_state(lib) == before
    run = load_run(out)
    assert len(run.points("bench")) == 5 and (run.bench["status"] == "ok").all()
    l2w = next(p for p in run.points("bench") if p["variant"] == "l2w")
    assert l2w["l2_set_aside"]["granted_bytes"] > 0 and l2w["l2_set_aside"]["previous_bytes"] == 4096
    assert l2w["window"]["window_bytes"] > 0 and 0 < l2w["window"]["hit_ratio"] <= 1
    s = lib.emu_state()
    assert s.windowed_launches > launches and s.launch_window_bytes > 0   # the window went with the launch


def test_the_profile_target_leaves_the_l2_state_as_it_found_it(tmp_path, capsys):
    exp, out = _four_tables(tmp_path, ("l2w",))
    lib = _emulated_device()
    before = _user_l2_state(lib)
    code = main(["profile", str(out), "--variant", "l2w", "--dataset", "medium", "--dataset", "high",
                 "--backend", "emulate"])
    printed = capsys.readouterr().out
    assert code == 0 and _l2_state(lib) == before
    assert "NVTX push chz/l2w/medium/0" in printed and "NVTX push chz/l2w/high/0" in printed


def test_hot_rows_come_from_the_warm_up_batches_only(tmp_path):
    from characterize.measure.worker import Session

    exp = load_experiment(str(write_experiment(tmp_path, datasets=("medium",), variants=("l2p",), max_reps=3)))
    session = Session.open(exp, "emulate")
    batches = session.dataset("medium")
    assert session.warmup == 1 and len(batches) == 2
    kernels, _ = session.bind("l2p", batches)
    for t, k in enumerate(kernels):
        warm = set(batches[0][t][0].tolist())
        assert set(k.hot_rows.tolist()) <= warm   # never a row only a timed batch reads
    import dataclasses

    from characterize.errors import ConfigError

    zero = dataclasses.replace(exp, bench=dataclasses.replace(exp.bench, warmup=0))
    with pytest.raises(ConfigError, match="warm-up"):
        Session.open(zero, "emulate").bind("l2p", batches)


def test_uvm_runs_in_either_mode_and_the_point_says_which(tmp_path):
    """The uvm variant's mode is a parameter (zero-copy by default, migrate=1): both run on
    the emulator (which has no managed memory: the table itself) and the point records it."""
    import torch

    from characterize.errors import ConfigError
    from characterize.kernels.library import run_variant
    from characterize.kernels.registry import get_variant, uvm_mode

    g = torch.Generator().manual_seed(11)
    w, idx = torch.rand(1009, 68, generator=g), torch.randint(0, 1009, (300,), generator=g)
    off = torch.tensor([0, 7, 7, 150])
    for migrate in (0, 1):
        out = run_variant("uvm", w, idx, off, params={"migrate": migrate}, backend="emulate")
        assert torch.allclose(out.output, torch.nn.functional.embedding_bag(idx, w, off, mode="sum"), atol=1e-5)
    assert uvm_mode(get_variant("uvm").resolve_params(None)) == "zero-copy" and uvm_mode({"migrate": 1}) == "migrate"
    with pytest.raises(ConfigError, match="migrate"):
        get_variant("uvm").resolve_params({"migrate": 2})
    _, out_dir = _run(tmp_path, variants=("uvm",))
    assert main(["bench", str(out_dir), "--point", "uvm:medium", "--backend", "emulate"]) == 0
    point = load_run(out_dir).points("bench")[0]
    assert point["status"] == "ok" and point["uvm"]["mode"] == "zero-copy" and point["params"] == {"migrate": 0}
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
    assert said.count("NVTX push chz/tbe/medium/0") == 1 and f"profiled tbe medium: {exp.workload.T} table" in said


def test_the_ncu_kernel_filter_matches_the_batched_kernel():
    import re

    from characterize.kernels.registry import get_variant
    from characterize.measure.worker import KERNEL_FILTER, launches_before_profiled, profiled_launches

    assert re.search(KERNEL_FILTER, get_variant("tbe").kernel_name({}, 128))
    # FBGEMM's forward kernels, training and inference, by their demangled names
    for name in ("split_embedding_codegen_forward_unweighted_kernel<float, float, float, false, long, 1ul, 32ul>",
                 "nbit::INT8_split_embedding_codegen_forward_unweighted_kernel_small_L<long, float, 2ul, 4ul>"):
        assert re.search(KERNEL_FILTER, name)
    assert profiled_launches("tbe", 4, 12) == 1 and profiled_launches("l2p", 4, 12) == 8
    assert profiled_launches("base", 4, 3) == 3 and profiled_launches("fbgemm", 4, 12) == 1
    # the check (one launch, then a float64 reference per table), then one launch per warm-up batch
    assert launches_before_profiled("tbe", 12, 2) == 1 + 12 + 2


@pytest.mark.skipif(not __import__("characterize.kernels.fbgemm", fromlist=["available"]).available(),
                    reason="fbgemm_gpu is not installed (the test extra has fbgemm-gpu-cpu on Linux x86_64)")
def test_fbgemm_is_timed_one_forward_for_every_table(tmp_path, capsys):
    """FBGEMM's TBE through its own module (its CPU build here): checked against torch, then
    timed as one forward per batch covering every table, reported per table as batch / T;
    its profile target runs that forward once inside the profiled range."""
    exp, out = _run(tmp_path, variants=("fbgemm",))
    assert main(["bench", str(out), "--point", "fbgemm:medium", "--backend", "emulate"]) == 0
    point = load_run(out).points("bench")[0]
    assert point["status"] == "ok" and point["check"]["passed"], point.get("error")
    assert point["launch"]["fbgemm"]["tables"] == exp.workload.T
    for row in point["summary"]:
        assert row["launches_per_batch"] == 1
        assert row["per_table_us"] == pytest.approx(row["per_batch_us"] / exp.workload.T)
    prof = open_experiment_run(exp, tmp_path / "prof", "profile", False, None, backend="emulate")
    assert main(["profile", str(prof.path), "--variant", "fbgemm", "--dataset", "medium", "--backend", "emulate"]) == 0
    said = capsys.readouterr().out
    assert said.count("NVTX push chz/fbgemm/medium/0") == 1


def test_a_variant_that_cannot_run_here_is_skipped_in_one_line(tmp_path, monkeypatch):
    from characterize import pipeline
    from characterize.kernels import fbgemm, library

    monkeypatch.setattr(library, "fbgemm_available", lambda: False)
    exp, out = _run(tmp_path, variants=("base", "fbgemm"))
    said: list[str] = []
    kept = pipeline.measurable(exp, "emulate", "bench", said.append, RunDir(out))
    assert kept.variants == ("base",)
    assert said == [f"bench: fbgemm skipped: FBGEMM is not installed ({fbgemm.INSTALL_HINT})"]
    assert "bench fbgemm: skipped" in (out / "log.txt").read_text()


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_the_batch_check_before_timing_reads_quantized_rows_as_the_kernel_does(dtype):
    """bench checks a batched variant's first batch before timing it: quantized rows (int8's
    scale and bias, fp8's e4m3 values and scale) are compared dequantized, as the kernel reads them
    (fp8's raw bytes widened as numbers would not even have the table's D columns)."""
    from characterize.config import WorkloadConfig
    from characterize.kernels.check import mixed_tables
    from characterize.kernels.library import bind_tables
    from characterize.measure.worker import check_batch

    tables, batch = mixed_tables(WorkloadConfig.tiny(), ["fp32", dtype], "medium")
    tb = bind_tables("tbe", tables, backend="emulate")
    assert check_batch(tb, [tb.map_batch(batch)], "tbe")["passed"]
