"""The model of host-resident tables: the cache's hit rate replayed from the trace (the
same as the emulated cache measures), its time split and host bytes, the managed-memory
page model, the cache-size sweep, the fit check steering tables larger than the GPU to
the host-resident variants, and predictions of such tables in bounded memory."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from characterize import pipeline
from characterize.analysis.model import predict as MP
from characterize.analysis.model.host import HostProfile, _Policy
from characterize.analysis.model.locality import TraceProfile
from characterize.cli.model import HOST_KEYS, PREDICT_KEYS, parse_ratios
from characterize.config import ExperimentConfig, WorkloadConfig
from characterize.errors import ConfigError, GpuMemoryError
from characterize.hardware.specs import GPUS, HOST_LINKS, UVM_PAGE_BYTES, gpu_spec
from characterize.kernels.library import bind
from characterize.kernels.registry import HOST_VARIANTS, VARIANT_ORDER
from characterize.workloads.traces import generate
from tests.analysis.test_model import group, sass, static
from tests.kernels.test_cache import odd_batches, reference_policy

#: odd and small: 3 batches (the first is warm-up), 10,007 rows
WL = WorkloadConfig(T=3, E=10_007, D=36, B=97, L=13, batches=3, seed=2)
RATIOS = [0.002, 0.01, 0.05, 0.2, 1.0]


@pytest.fixture(autouse=True)
def no_stored_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARACTERIZE_CALIBRATION", str(tmp_path / "calibration"))


def host_rows(df, variant="cache"):
    return df[df["variant"] == variant].sort_values("cache_ratio")


def test_cache_rows_carry_ratio_hit_rate_host_bytes_and_the_time_split():
    df = MP.predict(WL, ["medium", "low"], ["base", "cache", "uvm"], ["sm_80", "sm_90"], static=static(), sass=sass(),
                    cache_ratios=RATIOS)
    assert set(df["variant"]) == {"base", "cache", "uvm"}
    for (ds, gpu), rows in df[df["variant"] == "cache"].groupby(["dataset", "gpu"]):
        rows = rows.sort_values("cache_ratio")
        assert list(rows["cache_ratio"].round(6)) == [round(max(1, round(r * WL.E)) / WL.E, 6) for r in RATIOS]
        hit, host = rows["cache_hit_rate_pct"].to_numpy(), rows["host_bytes"].to_numpy()
        assert (np.diff(hit) >= -1e-9).all() and (np.diff(host) <= 1e-9).all(), (ds, gpu)
        assert hit[-1] == 100.0 and host[-1] == 0 and hit[0] < 100 and host[0] > 0
        split = rows["dedup_us"] + rows["transfer_us"] + rows["lookup_us"]
        assert np.allclose(split, rows["time_us"])
        base = df[(df["variant"] == "base") & (df["dataset"] == ds) & (df["gpu"] == gpu)]["time_us"].iloc[0]
        assert np.allclose(rows["lookup_us"], base)   # base's kernel on the cache slots
        assert (rows["speedup_vs_base"] < 1).all()    # the share of all-GPU speed
        assert (rows["host_link"] == gpu_spec(gpu).host_link).all()
    resident = df[df["variant"] == "base"]
    assert (resident["host_bytes"] == 0).all() and resident["cache_hit_rate_pct"].isna().all()


def test_the_predicted_hit_rate_is_what_the_emulated_cache_measures():
    """The model replays the cache's policy on the trace: it must agree with the cache
    itself run through the emulated kernel on the same batches."""
    C = 61
    prof = TraceProfile("medium", WL)
    replay = HostProfile(prof).cache(C)
    tr = generate("medium", WL, tables=[0]).tables[0]
    tk = bind("cache", torch.randn(WL.E, WL.D), trace=torch.from_numpy(tr.indices), params={"C": C},
              backend="emulate")
    for b in range(tr.batches):
        idx, off = tr.batch(b)
        tk.launch(torch.from_numpy(idx.copy()), torch.from_numpy(off.copy()))
    scored = tk.cache.stats[1:]
    assert replay.misses == pytest.approx(np.mean([s.misses for s in scored]))
    assert replay.hit_rate == pytest.approx(1 - sum(s.misses for s in scored) / sum(s.unique for s in scored))
    assert replay.lookup_hit_rate == pytest.approx(np.mean([s.lookup_hits / s.lookups for s in scored]))


def test_uvm_pages_fit_or_thrash():
    """uvm with migrate=1: pages move to the GPU on first touch and GPU memory caches them."""
    migrate = {"uvm": {"migrate": 1}}
    fits = MP.predict(WL, ["low"], ["uvm"], ["sm_80"], static=static(), sass=sass(), params=migrate)
    assert fits["cache_ratio"].iloc[0] == 1.0          # GPU memory holds the whole table
    # GPU memory for the traces and 4 pages per table
    memory = WL.device_bytes() - WL.T * WL.table_bytes + WL.T * 4 * UVM_PAGE_BYTES
    small = dataclasses.replace(gpu_spec("sm_80"), key="tiny-gpu", memory_bytes=memory)
    thrash = MP.predict(WL, ["low"], ["base", "uvm"], [small], static=static(), sass=sass(), params=migrate)
    row = thrash[thrash["variant"] == "uvm"].iloc[0]
    assert row["cache_ratio"] < 1 and row["cache_hit_rate_pct"] < fits["cache_hit_rate_pct"].iloc[0]
    assert row["host_bytes"] > 0                       # whole pages migrate, whatever a lookup reads
    assert row["time_us"] > thrash[thrash["variant"] == "base"]["time_us"].iloc[0]
    assert row["transfer_us"] > 0 and np.isclose(row["transfer_us"] + row["lookup_us"], row["time_us"])


def test_uvm_reads_in_place_over_the_link_by_default():
    """Zero-copy (migrate=0, as FBGEMM's managed tables run): every lookup's row crosses the
    host link (its sectors), whatever the trace's reuse: on an H200 (profiles/h200/paper-host)
    medium and random ran at the same 3.0-3.1 ms per table, the link's 52 GB/s; 30-70x
    cheaper than migrating 64 KiB pages for it."""
    zero = MP.predict(WL, ["low", "random"], ["base", "uvm"], ["sm_80"], static=static(), sass=sass())
    uvm = zero[zero["variant"] == "uvm"].set_index("dataset")
    row = uvm.loc["low"]
    gpu = gpu_spec("sm_80")
    assert row["transfer_us"] == pytest.approx(row["host_bytes"] / gpu.pcie_GBps / 1000)
    assert WL.lookups_per_batch * WL.row_bytes <= row["host_bytes"] <= WL.lookups_per_batch * WL.row_bytes * 1.3
    assert uvm.loc["low", "time_us"] == pytest.approx(uvm.loc["random", "time_us"], rel=0.02)
    assert row["time_us"] > zero[(zero["variant"] == "base") & (zero["dataset"] == "low")]["time_us"].iloc[0]


def test_host_links_are_in_the_spec_table_with_sources():
    assert {"PCIe 4.0 x16", "PCIe 5.0 x16", "NVLink-C2C"} <= set(HOST_LINKS)
    assert HOST_LINKS["PCIe 4.0 x16"].GBps == 25.0 and HOST_LINKS["PCIe 5.0 x16"].GBps == 50.0
    assert HOST_LINKS["NVLink-C2C"].GBps == 450.0
    for g in GPUS.values():   # each GPU's link figures are its link's
        link = HOST_LINKS[g.host_link]
        assert (g.pcie_GBps, g.host_latency_us, g.uvm_fault_batch_us) == (link.GBps, link.latency_us,
                                                                           link.uvm_fault_batch_us), g.key
        assert g.host_link_source == link.source and "GB/s" in link.source
    assert gpu_spec("sm_80").host_link == "PCIe 4.0 x16" and gpu_spec("sm_90").host_link == "PCIe 5.0 x16"


LARGE = WorkloadConfig(T=24, E=20_000_000, D=128, B=64, L=10, batches=2)


def test_tables_beyond_the_gpu_are_steered_to_host_resident_variants():
    exp = ExperimentConfig(name="big", workload=LARGE, datasets=("medium",))
    checked = pipeline.check_experiment(exp)
    assert checked.variants == HOST_VARIANTS
    small = pipeline.check_experiment(dataclasses.replace(exp, workload=LARGE.replace(E=1000)))
    assert small.variants == VARIANT_ORDER
    with pytest.raises(GpuMemoryError, match="variants cache or uvm"):
        pipeline.check_experiment(dataclasses.replace(exp, variants=("base", "cache")))
    with pytest.raises(GpuMemoryError, match="lower C"):
        pipeline.check_experiment(dataclasses.replace(exp, variants=("cache",), params={"cache": {"C": 10_000_000}}))
    assert LARGE.host_resident_device_bytes(300_000) < gpu_spec("sm_80").memory_bytes < LARGE.device_bytes()


def test_a_table_of_tens_of_millions_of_rows_is_analyzed_on_its_trace():
    prof = TraceProfile("low", LARGE)
    assert prof.E == LARGE.E and prof.rows <= LARGE.B * LARGE.L.max * LARGE.batches   # per-row arrays follow the trace
    df = MP.predict(LARGE, ["low"], ["cache", "uvm"], ["sm_80"], static=static(), sass=sass(), cache_ratios=[0.015])
    assert set(df["variant"]) == {"cache", "uvm"} and df["time_us"].notna().all()
    assert df[df["variant"] == "uvm"]["cache_ratio"].iloc[0] < 1


def test_parse_ratios():
    assert parse_ratios("0.5%,1.5%, 5%") == pytest.approx([0.005, 0.015, 0.05])
    assert parse_ratios("0.01,1") == [0.01, 1.0]
    for bad, why in (("lots", "bad cache ratio"), ("0%", "outside"), ("150%", "outside"), (",", "at least one")):
        with pytest.raises(ConfigError, match=why):
            parse_ratios(bad)


def test_cli_cache_ratio_sweep(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline.predictions, "code_facts", lambda v, a, D, *r, **k: pipeline.CodeFacts(
        D, static(), sass()))
    toml = tmp_path / "host.toml"
    toml.write_text('name = "host"\ndatasets = ["medium"]\nvariants = ["base", "uvm"]\narchs = ["sm_80"]\n'
                    '[workload]\nT = 3\nE = 10007\nD = 36\nB = 97\nL = "13"\nbatches = 3\ndtype = "fp16"\n')
    res = CliRunner().invoke(group(), ["predict", str(toml), "--cache-ratio", "0.5%,5%,100%", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert all(set(r) == set(PREDICT_KEYS) | set(HOST_KEYS) and r["dtype"] == "fp16" for r in rows)
    cache = [r for r in rows if r["variant"] == "cache"]
    assert [r["cache_ratio"] for r in cache] == pytest.approx([50 / 10007, 500 / 10007, 1.0])
    assert cache[-1]["cache_hit_rate_pct"] == 100 and cache[-1]["host_bytes"] == 0
    assert all(r["cache_ratio"] is None and r["host_bytes"] == 0 for r in rows if r["variant"] == "base")
    table = CliRunner().invoke(group(), ["predict", str(toml), "--cache-ratio", "1.5%"])
    assert table.exit_code == 0 and "host-resident tables" in table.output and "pct_of_all_gpu" in table.output
    bad = CliRunner().invoke(group(), ["predict", str(toml), "--cache-ratio", "5 percent"])
    assert bad.exit_code == 2 and "bad cache ratio" in bad.output and "Traceback" not in bad.output


@pytest.mark.parametrize("C", [1, 16, 45])
def test_the_models_policy_matches_the_independent_replay(C):
    E, batches = 1009, odd_batches()
    warm = batches[0][0][:50].numpy()
    policy = _Policy(E, C, np.bincount(warm, minlength=E))
    got = [policy.step(i.numpy())[:4] for i, _ in batches]
    want, cached = reference_policy(E, C, warm, [i.numpy() for i, _ in batches])
    assert [(u - m, m, a, e) for u, m, a, e in got] == want
    assert set(policy.slot_row[policy.slot_row >= 0].tolist()) == cached
