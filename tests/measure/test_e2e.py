"""The DLRM step around each variant: correctness on the CPU, the stage model, the CLI."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from characterize.analysis.model.constants import ModelConstants
from characterize.analysis.model.e2e import INFERENCE_STAGES, TRAINING_STAGES, Overheads, predict_step, walk
from characterize.cli import main
from characterize.cli.e2e import E2E_KEYS
from characterize.config import DlrmConfig, WorkloadConfig
from characterize.errors import ConfigError
from characterize.hardware import gpu_spec
from characterize.kernels.registry import VARIANT_ORDER
from characterize.measure import e2e


def test_every_variant_runs_the_step_like_autograd_and_wrong_does_not():
    checks = pd.DataFrame(e2e.check_pipeline([*VARIANT_ORDER, "wrong"]))
    ok = checks[checks["variant"] != "wrong"]
    assert ok["ok"].all(), ok[~ok["ok"]]
    assert set(ok["backward"]) == {"", "sort", "atomic"} and set(ok["optimizer"]) == {"", "sgd", "rowwise_adagrad"}
    assert not checks[checks["variant"] == "wrong"]["ok"].any()


def test_backwards_agree_on_duplicate_ids_in_one_bag():
    wl = WorkloadConfig(T=1, E=7, D=3, B=2, L=4, batches=1)
    dl = DlrmConfig(bottom=(5, 3), top=(1,))
    model = e2e.Dlrm.create(wl, dl, torch.device("cpu"))
    idx, off = torch.tensor([2, 2, 2, 5, 0, 5, 5, 1]), torch.tensor([0, 4])
    batch = e2e.Batch(torch.rand(2, 5), [idx], [off], [torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])],
                      [torch.tensor([4, 4])], torch.ones(2, 1))
    g = torch.rand(2, 3)
    sort, atomic = (e2e.embedding_grad(model, 0, batch, g, how) for how in ("sort", "atomic"))
    w = model.tables[0].clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(torch.nn.functional.embedding_bag(idx, w, off, mode="sum"), w, g)
    assert torch.allclose(sort, auto) and torch.allclose(atomic, auto)
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
    res = CliRunner().invoke(main, ["e2e", str(toml), "--bottom", "32-64", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows and all(set(E2E_KEYS) <= set(r) for r in rows)
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
