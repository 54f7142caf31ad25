"""The DLRM step around each variant: correctness on the CPU, the stage model, the CLI."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from characterize.analysis.model.constants import ModelConstants
from characterize.analysis.model.e2e import (
    BACKWARDS,
    INFERENCE_STAGES,
    TRAINING_STAGES,
    KernelFacts,
    Overheads,
    predict_step,
    training_kernel_us,
    walk,
)
from characterize.cli import main
from characterize.cli.e2e import E2E_KEYS
from characterize.config import DlrmConfig, WorkloadConfig
from characterize.errors import ConfigError
from characterize.hardware.specs import gpu_spec
from characterize.kernels.registry import VARIANT_ORDER
from characterize.kernels.training import CUDA_BACKWARDS, training_facts
from characterize.measure import e2e
from tests.conftest import needs_tools


def test_every_variant_runs_the_step_like_autograd_and_wrong_does_not():
    checks = pd.DataFrame(e2e.check_pipeline([*VARIANT_ORDER, "wrong"], backwards=("sort", "atomic")))
    ok = checks[checks["variant"] != "wrong"]
    assert ok["ok"].all(), ok[~ok["ok"]]
    assert set(ok["backward"]) == {"", "sort", "atomic"} and set(ok["optimizer"]) == {"", "sgd", "rowwise_adagrad"}
    assert not checks[checks["variant"] == "wrong"]["ok"].any()


def test_our_training_kernels_run_the_step_like_autograd_through_the_emulator():
    """cuda-atomic, cuda-sorted and cuda-fused (SGD and row-wise Adagrad fused into the
    backward) on the CPU emulator, two steps running; l2w keeps its table reordered while
    bound, so the fused update must find each row where it lives and its momentum by id."""
    checks = pd.DataFrame(e2e.check_pipeline(["base", "l2w", "wrong"], backwards=CUDA_BACKWARDS))
    ok = checks[checks["variant"] != "wrong"]
    assert ok["ok"].all(), ok[~ok["ok"]]
    assert set(ok["backward"]) == {"", *CUDA_BACKWARDS} and len(ok) == 2 * (1 + 3 * 2)
    assert not checks[checks["variant"] == "wrong"]["ok"].any()
    assert set(CUDA_BACKWARDS) < set(BACKWARDS)


def test_backwards_agree_on_duplicate_ids_in_one_bag():
    wl = WorkloadConfig(T=1, E=7, D=3, B=2, L=4, batches=1)
    dl = DlrmConfig(bottom=(5, 3), top=(1,))
    model = e2e.Dlrm.create(wl, dl, torch.device("cpu"))
    idx, off = torch.tensor([2, 2, 2, 5, 0, 5, 5, 1]), torch.tensor([0, 4])
    batch = e2e.Batch(torch.rand(2, 5), [idx], [off], [torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])],
                      [torch.tensor([4, 4])], torch.ones(2, 1))
    g = torch.rand(2, 3)
    w = model.tables[0].clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(torch.nn.functional.embedding_bag(idx, w, off, mode="sum"), w, g)
    for how in ("sort", "atomic", "cuda-atomic", "cuda-sorted"):
        assert torch.allclose(e2e.embedding_grad(model, 0, batch, g, how), auto), how
    with pytest.raises(ConfigError, match="cuda-fused"):
        e2e.embedding_grad(model, 0, batch, g, "cuda-fused")
    assert torch.allclose(auto[2], 3 * g[0]) and torch.allclose(auto[5], g[0] + 2 * g[1])


def test_dlrm_config_is_checked():
    with pytest.raises(ConfigError, match="D=128"):
        DlrmConfig(bottom=(256, 64)).validate(128)
    with pytest.raises(ConfigError, match="widths"):
        DlrmConfig.parse_dims("256-x")
    assert DlrmConfig().interaction_width(12, 128) == 128 + 78


def _embedding(variants=("base", "rpf")) -> pd.DataFrame:
    return pd.DataFrame([{"variant": v, "dataset": "medium", "gpu": "a100-80gb", "time_us": t, "time_us_low": 0.8 * t,
                          "time_us_high": 1.3 * t, "prepass_us": float("nan")}
                         for v, t in zip(variants, (120.0, 60.0))])


def test_stage_model_walks_the_graph_and_keeps_its_band():
    g = gpu_spec("sm_80")
    wl = WorkloadConfig.paper()
    df = predict_step(wl, DlrmConfig(), _embedding(), [g], {g.key: ModelConstants.defaults(g)}, {"medium": 90_000.0})
    tot = df[df["stage"] == "total"].set_index(["variant", "phase"])
    for (v, phase), r in tot.iterrows():
        stages = df[(df["variant"] == v) & (df["phase"] == phase) & ~df["stage"].isin(["total", "active"])]
        assert list(stages["stage"]) == list(INFERENCE_STAGES if phase == "inference" else TRAINING_STAGES)
        assert stages["time_us"].sum() == pytest.approx(r["time_us"])
        assert r["time_us_low"] <= r["time_us"] <= r["time_us_high"]
    assert tot.loc[("base", "training"), "time_us"] > tot.loc[("base", "inference"), "time_us"]
    assert tot.loc[("rpf", "inference"), "speedup_embedding"] == pytest.approx(2.0)
    assert 1.0 < tot.loc[("rpf", "inference"), "speedup_e2e"] < 2.0
    assert tot.loc[("base", "inference"), "speedup_e2e"] == pytest.approx(1.0)
    assert df["source"].eq("predicted").all()


def test_a_kernel_covering_every_table_is_one_launch_per_batch_whatever_the_column_type():
    """fbgemm and tbe predict one launch for all T tables: its time enters the step once.
    Read from predictions.csv the count is a numpy integer, as here."""
    g = gpu_spec("sm_80")
    wl = WorkloadConfig.paper()
    emb = _embedding(("base", "fbgemm"))
    emb["tables_per_launch"] = pd.Series([1, wl.T], dtype="int64")
    emb.loc[emb["variant"] == "fbgemm", ["time_us", "time_us_low", "time_us_high"]] = [600.0, 480.0, 780.0]
    df = predict_step(wl, DlrmConfig(), emb, [g], {g.key: ModelConstants.defaults(g)}, {"medium": 90_000.0},
                      phases=("inference",))
    tot = df[df["stage"] == "total"].set_index("variant")
    emb_stage = df[df["stage"] == "embedding"].set_index("variant")["time_us"]
    assert emb_stage["fbgemm"] == pytest.approx(600.0, rel=0.05)            # once, not T times
    assert emb_stage["base"] >= wl.T * 120.0
    assert tot.loc["fbgemm", "speedup_embedding"] == pytest.approx(wl.T * 120.0 / 600.0)
    assert tot.loc["fbgemm", "speedup_e2e"] > 1.0


def test_host_dispatch_gaps_are_idle_time():
    from characterize.analysis.model.e2e import Op

    ops = [Op("a", "k1", 1.0, 1.0, 1.0), Op("b", "k2", 1.0, 1.0, 1.0)]
    total, stages = walk(ops, dispatch_us=10.0)
    assert total == pytest.approx(21.0) and stages == {"a": pytest.approx(11.0), "b": pytest.approx(10.0)}
    assert walk(ops, dispatch_us=0.0)[0] == pytest.approx(2.0)
    with pytest.raises(ConfigError):
        Overheads(matmul="fp8").validate()


def test_cli_e2e_json(tmp_path):
    toml = tmp_path / "e.toml"
    toml.write_text('name = "e"\ndatasets = ["high"]\nvariants = ["base", "warp"]\narchs = ["sm_80"]\n'
                    '[workload]\nT = 2\nE = 20000\nD = 64\nB = 128\nL = "10"\nbatches = 2\n')
    res = CliRunner().invoke(main, ["e2e", str(toml), "--bottom", "32-64", "--variants", "base,warp,fbgemm",
                                    "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows and all(set(E2E_KEYS) <= set(r) for r in rows)
    assert "checking the DLRM step" in res.stderr   # progress on stderr, the JSON alone on stdout
    assert {r["phase"] for r in rows} == {"inference", "training"}
    bad = CliRunner().invoke(main, ["e2e", str(toml), "--bottom", "32-16"])
    assert bad.exit_code != 0 and "D=64" in bad.output


@pytest.mark.gpu
def test_measured_step_on_the_gpu():
    wl = WorkloadConfig(T=2, E=50_000, D=64, B=256, L=20, batches=2)
    rows = pd.DataFrame(e2e.measure_step(wl, DlrmConfig(bottom=(32, 64), top=(16, 1)), ["base", "warp"], ["medium"],
                                         reps=5))
    assert set(rows["source"]) == {"measured"} and (rows["time_us"] > 0).all()
    assert {"total", "embedding", "embedding_backward"} <= set(rows["stage"])


def test_stage_gmae_joins_measured_and_predicted_stages():
    from characterize.analysis.model.e2e import stage_gmae

    common = {"variant": "base", "dataset": "medium", "gpu": "h100-sxm", "phase": "inference"}
    rows = pd.DataFrame([
        common | {"stage": "input_copy", "time_us": 100.0, "source": "predicted"},
        common | {"stage": "embedding", "time_us": 200.0, "source": "predicted"},
        common | {"stage": "total", "time_us": 400.0, "source": "predicted"},
        common | {"stage": "embedding", "time_us": 250.0, "source": "measured"},
        common | {"stage": "total", "time_us": 300.0, "source": "measured"},   # inputs already on the GPU
    ])
    g = stage_gmae(rows).set_index("stage")
    assert g.loc["embedding", "gmae"] == pytest.approx(0.2) and g.loc["step", "gmae"] == pytest.approx(1e-4)  # floored
    assert stage_gmae(rows[rows["source"] == "predicted"]).empty




@needs_tools
def test_our_backward_is_modelled_from_its_compiled_code():
    g = gpu_spec("sm_80")
    wl = WorkloadConfig.paper()
    facts = training_facts(archs=["sm_80"])
    c = {g.key: ModelConstants.defaults(g)}
    step = {}
    for how, opt in (("sort", "sgd"), ("cuda-atomic", "sgd"), ("cuda-sorted", "sgd"), ("cuda-fused", "sgd")):
        df = predict_step(wl, DlrmConfig(), _embedding(), [g], c, {"medium": 90_000.0}, phases=("training",),
                          backward=how, optimizer=opt, training=facts, hottest={"medium": 1800.0})
        step[how] = df[df["variant"] == "base"].set_index("stage")["time_us"]
    # fused: the tables' update happens in the backward, the optimizer stage keeps the MLPs
    assert step["cuda-fused"]["optimizer"] < 0.05 * step["cuda-sorted"]["optimizer"]
    assert step["cuda-fused"]["total"] < step["cuda-sorted"]["total"]
    # the SASS facts drive the kernel's time: fewer serialized latencies, a shorter latency term
    f = KernelFacts.from_row(facts[facts["kernel"] == "cuda-sorted"].iloc[0])
    fast = KernelFacts(**{**f.__dict__, "latencies_per_iteration": f.latencies_per_iteration / 4})
    terms = training_kernel_us(f, wl, 90_000.0, 1800.0, g, c[g.key])
    assert training_kernel_us(fast, wl, 90_000.0, 1800.0, g, c[g.key])["latency"] == pytest.approx(
        terms["latency"] / 4)
    # one warp walks the hottest row's segment, split into chunks of about its square root
    # beyond 64 lookups: a hotter row costs more, but far less than walking it whole
    hot = training_kernel_us(f, wl, 90_000.0, 300_000.0, g, c[g.key])
    whole = 300_000 / 4 * f.latencies_per_iteration * c[g.key].l2_latency_ns / 1000
    assert terms["latency"] < hot["latency"] < whole / 50
    atomic = KernelFacts.from_row(facts[facts["kernel"] == "cuda-atomic"].iloc[0])
    a = training_kernel_us(atomic, wl, 90_000.0, 1800.0, g, c[g.key])
    assert a["atomics"] > 0 and a["l2"] == 0.0   # it scatters; it gathers nothing
    with pytest.raises(ConfigError, match="facts"):
        predict_step(wl, DlrmConfig(), _embedding(), [g], c, {"medium": 90_000.0}, backward="cuda-atomic")


@needs_tools
def test_cli_sass_training_and_e2e_with_our_backward(tmp_path):
    res = CliRunner().invoke(main, ["sass", "--training", "--arch", "sm_90", "--D", "64", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["kernel"] for r in rows} == {"cuda-atomic", "cuda-sorted", "cuda-fused-sgd",
                                           "cuda-fused-rowwise_adagrad"}
    assert all(r["arch"] == "sm_90" and r["registers"] > 0 for r in rows)
    bad = CliRunner().invoke(main, ["sass", "--training", "--D", "300"])
    assert bad.exit_code != 0 and "D <= 256" in bad.output and "Traceback" not in bad.output
    toml = tmp_path / "e.toml"
    toml.write_text('name = "e"\ndatasets = ["high"]\nvariants = ["base"]\narchs = ["sm_80"]\n'
                    '[workload]\nT = 2\nE = 20000\nD = 64\nB = 128\nL = "10"\nbatches = 2\n')
    res = CliRunner().invoke(main, ["e2e", str(toml), "--bottom", "32-64", "--backward", "cuda-fused", "--optimizer",
                                    "rowwise_adagrad", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert any(r["stage"] == "embedding_backward" and r["time_us"] > 0 for r in rows)


@pytest.mark.gpu
def test_training_kernels_are_timed_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    wl = WorkloadConfig(T=2, E=50_000, D=64, B=256, L=20, batches=2)
    rows = pd.DataFrame(e2e.time_training_kernels(wl, ["medium"], reps=5))
    assert set(rows["kernel"]) == set(CUDA_BACKWARDS[:2]) | {"cuda-fused-sgd", "cuda-fused-rowwise_adagrad"}
    assert (rows["time_us"] > 0).all() and set(rows["source"]) == {"measured"}
    assert {"kernel", "prepare", "zero_gradient"} <= set(rows["stage"])
    wl_big = WorkloadConfig(T=1, E=50_000, D=64, B=256, L=20, batches=1)
    step = pd.DataFrame(e2e.measure_step(wl_big, DlrmConfig(bottom=(32, 64), top=(16, 1)), ["base"], ["medium"],
                                         phases=("training",), backward="cuda-fused", optimizer="rowwise_adagrad",
                                         reps=3))
    assert (step[step["stage"] == "embedding_backward"]["time_us"] > 0).all()


def test_a_variant_whose_package_is_missing_is_predicted_not_checked(monkeypatch):
    """Without FBGEMM, e2e predicts fbgemm from its SASS and says in one line why it neither
    checks nor times it, instead of failing."""
    import sys

    from characterize.pipeline import e2e as run_e2e
    from characterize.pipeline import load_experiment

    monkeypatch.setitem(sys.modules, "fbgemm_gpu", None)
    lines: list[str] = []
    exp = dataclasses.replace(load_experiment("quick"), datasets=("high",))
    out = run_e2e(exp, ["warp", "fbgemm"], ["sm_80"], progress=lines.append)
    assert any("fbgemm predicted only" in line and "not installed" in line for line in lines), lines
    assert set(out.checks["variant"]) == {"base", "warp"} and out.checks["ok"].all()
    assert "fbgemm" in set(out.rows["variant"])
