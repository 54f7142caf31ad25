"""Memory budgets (issue 13, case 4): the bytes a workload, a trace or a statistic needs
are estimated before anything is allocated and refused beyond the budget, and a trace
file larger than the memory it may use is streamed: range-checked whole, only the
lookups the workload takes are kept."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from characterize.config import Pooling, WorkloadConfig
from characterize.errors import ConfigError, MemoryBudgetError, WorkloadError
from characterize.measure.worker import Session
from characterize.memory import MEMORY_BUDGET_ENV, available_memory, check_memory, memory_budget, parse_memory
from characterize.pipeline import load_experiment
from characterize.workloads import traces
from characterize.workloads.locality import reuse_distances, source_locality
from characterize.workloads.traces import generate, generate_stream, load_trace
from tests.conftest import write_experiment

SMALL = WorkloadConfig(T=2, E=1_000_000, D=8, B=16, L=Pooling.parse("4"), batches=2)


@pytest.mark.parametrize("text, absolute, share", [("8G", 8e9, None), ("512MiB", 2**29, None), ("2e9", 2e9, None),
                                                   ("1.5 GiB", 1.5 * 2**30, None), ("50%", None, 0.5)])
def test_budgets_parse(text, absolute, share):
    assert parse_memory(text) == (absolute, share)


@pytest.mark.parametrize("text", ["lots", "0", "-1G", "150%", "8 parsecs", ""])
def test_bad_budgets_are_config_errors(text):
    with pytest.raises(ConfigError, match="bad memory budget"):
        parse_memory(text)


def test_the_default_budget_is_a_share_of_the_available_memory(monkeypatch):
    monkeypatch.delenv(MEMORY_BUDGET_ENV, raising=False)
    avail = available_memory()
    budget, how = memory_budget()
    assert avail and budget == int(avail * 0.6) and "60% of the" in how
    monkeypatch.setenv(MEMORY_BUDGET_ENV, "25%")
    assert memory_budget()[0] == pytest.approx(available_memory() * 0.25, rel=0.05)
    monkeypatch.setenv(MEMORY_BUDGET_ENV, "3G")
    assert memory_budget() == (3_000_000_000, f"{MEMORY_BUDGET_ENV}=3G")
    with pytest.raises(MemoryBudgetError, match=r"a test would need about 4\.7 GiB of memory, more than the budget "
                                                r"of 2\.8 GiB \(CHARACTERIZE_MEMORY_BUDGET=3G\); do less"):
        check_memory(5e9, "a test", "do less")
    check_memory(2e9, "a test", "do less")


def test_generation_statistics_and_emulated_tables_are_refused_before_allocating(monkeypatch, tmp_path):
    monkeypatch.setenv(MEMORY_BUDGET_ENV, "64M")
    tracemalloc.start()
    try:
        with pytest.raises(MemoryBudgetError, match="generating medium for 12 table"):
            generate("medium", WorkloadConfig())
        with pytest.raises(MemoryBudgetError, match="generating 100,000,000 random lookups"):
            generate_stream("random", 1000, 100_000_000)
        with pytest.raises(MemoryBudgetError, match="the locality statistics of low"):
            source_locality("low", WorkloadConfig())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20  # refused, not attempted
    with pytest.raises(MemoryBudgetError, match="the reuse distances of 2,000,000 lookups"):
        reuse_distances(np.zeros(2_000_000, dtype=np.int64))
    exp = load_experiment(str(write_experiment(tmp_path)))
    with pytest.raises(MemoryBudgetError, match=r"emulating 12 table\(s\) of 244\.1 MiB on the CPU"):
        Session.open(dataclasses.replace(exp, workload=WorkloadConfig()), "emulate")


def _peak(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("suffix", [".txt", ".npy"])
def test_a_trace_file_larger_than_what_is_kept_is_streamed(tmp_path, monkeypatch, suffix):
    """A 2M-lookup file (13-16 MB) read for 128 lookups a table in 256 KiB chunks: the
    whole file is checked (its largest index, at the very end, sets E), little is held."""
    monkeypatch.setattr(traces, "CHUNK_BYTES", 256 * 1024)
    values = np.random.default_rng(5).integers(0, 500_000, 2_000_000)
    values[-1] = 999_999
    p = tmp_path / f"big{suffix}"
    if suffix == ".txt":
        p.write_text("\n".join(map(str, values.tolist())) + "\n")
    else:
        np.save(p, values)
    ds, peak = _peak(lambda: load_trace(p, SMALL))
    assert p.stat().st_size > 12 * 2**20 and peak < 3 * 2**20, peak
    assert ds.rows == 1_000_000 and ds.meta["stream_lengths"] == [2_000_000]
    n0 = len(ds.tables[0].indices)
    assert np.array_equal(ds.tables[0].indices, values[:n0])
    assert np.array_equal(ds.tables[1].indices, values[n0:n0 + len(ds.tables[1].indices)])
    with pytest.raises(WorkloadError, match=r"position 1999999: index 999999 is out of range for 999999 rows"):
        load_trace(p, SMALL, rows=999_999)


def test_a_trace_needing_more_than_the_budget_is_refused_before_reading(tmp_path, monkeypatch):
    np.save(tmp_path / "t.npy", np.arange(1000))
    monkeypatch.setenv(MEMORY_BUDGET_ENV, "1M")
    with pytest.raises(MemoryBudgetError, match=r"reading 3,932,160 lookups of t\.npy for 12 table\(s\)"):
        load_trace(tmp_path / "t.npy", WorkloadConfig(B=4096, L=Pooling.parse("10"), batches=8))
    np.savez(tmp_path / "z.npz", indices=np.arange(300_000), offsets=np.array([0, 300_000]))
    with pytest.raises(MemoryBudgetError, match=r"loading z\.npz would need about 6\.9 MiB"):
        load_trace(tmp_path / "z.npz", SMALL)
