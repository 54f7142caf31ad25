import json

import numpy as np
import pytest
import torch

from characterize.config import Pooling, WorkloadConfig
from characterize.errors import ConfigError, WorkloadError
from characterize.workloads.locality import (
    locality_stats,
    lru_hit_rate,
    reuse_distances,
    top_k_coverage,
)
from characterize.workloads.presets import CALIBRATION, PRESETS, parse_dataset
from characterize.workloads.traces import (
    generate,
    generate_stream,
    load_dataset,
    load_trace,
)


def brute_reuse(seq):
    last, out = {}, []
    for t, v in enumerate(seq):
        out.append(len(set(seq[last[v] + 1:t])) if v in last else -1)
        last[v] = t
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reuse_distance_matches_definition(seed):
    seq = np.random.default_rng(seed).integers(0, 37, 1500)
    assert list(reuse_distances(seq)) == brute_reuse(seq.tolist())


def test_reuse_distance_sparse_ids_and_lru():
    seq = np.array([10**12, 5, 10**12, 5, 5, 7])
    d = reuse_distances(seq)
    assert list(d) == [-1, -1, 1, 1, 0, -1]
    assert lru_hit_rate(d, 1) == pytest.approx(1 / 6) and lru_hit_rate(d, 2) == pytest.approx(3 / 6)


def test_generation_is_deterministic_and_tables_differ():
    c = WorkloadConfig.tiny()
    a, b = generate("medium", c), generate("medium", c)
    assert all(np.array_equal(x.indices, y.indices) for x, y in zip(a.tables, b.tables))
    assert not np.array_equal(a.tables[0].indices, a.tables[1].indices)
    assert not np.array_equal(generate("medium", c.replace(seed=8)).tables[0].indices, a.tables[0].indices)
    t = a.tables[0]
    assert t.offsets.shape == (c.batches, c.B) and t.starts[-1] == len(t.indices)
    assert (t.lengths() == 0).any() and t.lengths().max() <= 20  # uniform:0:20 has empty bags


def test_hot_rows_are_scattered():
    x = generate_stream("high", 500_000, 200_000)
    rows, counts = np.unique(x, return_counts=True)
    hottest = rows[np.argsort(-counts)[:1000]]
    assert hottest.min() < 50_000 and hottest.max() > 450_000  # not rows 0..K


@pytest.mark.parametrize("name", list(CALIBRATION))
def test_presets_match_published_traces(name):
    lookups, rows, unique, cover = CALIBRATION[name]
    s = locality_stats(generate_stream(name, rows, lookups), rows, 512, [60_000])
    assert s.unique_rows == pytest.approx(unique, rel=0.03)
    assert s.top_k_coverage[60_000] == pytest.approx(cover, abs=0.015)


def test_hotness_ordering_of_presets():
    cover = {n: locality_stats(generate_stream(n, 500_000, 300_000), 500_000).top_k_coverage[60_000] for n in PRESETS}
    assert cover["one-item"] == 1.0 >= cover["high"] > cover["medium"] > cover["low"] > cover["random"]


def test_dataset_specs():
    assert parse_dataset("zipf:1.2").alpha == 1.2
    for bad in ("zipf:0", "hot"):
        with pytest.raises(ConfigError):
            parse_dataset(bad)


def test_stats_json_keys():
    s = locality_stats(generate_stream("medium", 10_000, 20_000), 10_000, 512, [100, 1000]).to_json()
    assert {"lookups", "unique_rows", "top_k_coverage", "reuse_distance_quantiles"} <= set(s)
    assert set(s["top_k_coverage"]) == {"100", "1000"} and "p50" in s["reuse_distance_quantiles"]
    json.dumps(s)
    assert top_k_coverage(np.array([1, 1, 1, 2]), [1, 5]) == {1: 0.75, 5: 1.0}


# ------------------------------------------------------------------ loaders
@pytest.fixture
def small():
    return WorkloadConfig(T=3, E=100, D=8, B=4, L=Pooling.parse("3"), batches=2)


def test_text_trace_read_circularly(tmp_path, small):
    p = tmp_path / "trace.txt"
    p.write_text("# a comment\n" + "\n".join(str(i) for i in range(10)) + "\n")
    ds = load_trace(p, small, rows=100)
    assert ds.rows == 100 and len(ds.tables) == 3
    assert list(ds.tables[0].indices[:12]) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]  # wraps around
    assert ds.tables[1].indices[0] == 4  # the next table continues the stream (24 % 10)


def test_npy_streams(tmp_path, small):
    np.save(tmp_path / "one.npy", np.arange(50))
    np.save(tmp_path / "per_table.npy", np.arange(60).reshape(3, 20))
    assert load_trace(tmp_path / "one.npy", small).rows == 50
    ds = load_trace(tmp_path / "per_table.npy", small)
    assert ds.tables[2].indices[0] == 40


def test_npz_bagged_and_per_table(tmp_path, small):
    lengths = np.array([[2, 0, 3, 1] * 2, [1, 1, 1, 1] * 2])  # 2 tables x 8 bags
    idx = np.arange(lengths.sum()) % 30
    np.savez(tmp_path / "bags.npz", indices=idx, offsets=np.concatenate([[0], np.cumsum(lengths)]), lengths=lengths)
    ds = load_trace(tmp_path / "bags.npz", small, rows=30)
    assert len(ds.tables) == 2 and ds.tables[0].batches == 2
    assert list(ds.tables[0].lengths()) == [2, 0, 3, 1, 2, 0, 3, 1]
    np.savez(tmp_path / "tables.npz", a=np.arange(10), b=np.arange(10, 30))
    assert load_trace(tmp_path / "tables.npz", small).tables[1].indices[0] == 10


def test_dlrm_pt_layout(tmp_path, small):
    _T, _B = 2, 8
    lengths = torch.tensor([[1, 2, 0, 3, 1, 1, 2, 1], [2, 2, 2, 2, 1, 0, 1, 1]])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths.flatten(), 0)])
    indices = torch.arange(int(offsets[-1])) * 3 % 40
    torch.save((indices, offsets, lengths), tmp_path / "t.pt")
    ds = load_trace(tmp_path / "t.pt", small)
    assert len(ds.tables) == 2 and ds.rows == 40
    assert list(ds.tables[1].indices[:3]) == [int(i) for i in indices[11:14]]


def test_out_of_range_and_negative_name_file_table_and_position(tmp_path, small):
    np.save(tmp_path / "t.npy", np.array([[1, 2, 3], [4, 500, 6]]))
    with pytest.raises(WorkloadError, match=r"t\.npy: table 1, position 1: index 500"):
        load_trace(tmp_path / "t.npy", small, rows=100)
    (tmp_path / "n.txt").write_text("1\n-4\n")
    with pytest.raises(WorkloadError, match=r"n\.txt: table 0, position 1: negative index -4"):
        load_trace(tmp_path / "n.txt", small)
    lengths = torch.tensor([[1, 1], [1, 1]])
    torch.save((torch.tensor([1, 2, 3, 99]), torch.tensor([0, 1, 2, 3, 4]), lengths), tmp_path / "d.pt")
    with pytest.raises(WorkloadError, match=r"d\.pt: table 1, position 3: index 99"):
        load_trace(tmp_path / "d.pt", small, rows=50)


def test_malformed_and_truncated_files(tmp_path, small):
    (tmp_path / "bad.txt").write_text("1\n2\nthree\n")
    with pytest.raises(WorkloadError, match="line 3"):
        load_trace(tmp_path / "bad.txt", small)
    np.savez(tmp_path / "z.npz", indices=np.arange(100), offsets=np.array([0, 10, 20]))
    raw = (tmp_path / "z.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(WorkloadError, match="cut.npz"):
        load_trace(tmp_path / "cut.npz", small)
    torch.save((torch.tensor([1, 2]), torch.tensor([0, 5])), tmp_path / "short.pt")
    with pytest.raises(WorkloadError, match="truncated"):
        load_trace(tmp_path / "short.pt", small)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(WorkloadError, match="no indices"):
        load_trace(tmp_path / "empty.txt", small)
    with pytest.raises(WorkloadError, match="no such"):
        load_trace(tmp_path / "absent.npy", small)


def test_load_dataset_dispatch(tmp_path, small):
    assert load_dataset("random", small).name == "random"
    np.save(tmp_path / "x.npy", np.arange(20))
    assert load_dataset(str(tmp_path / "x.npy"), small).name == "x"


def test_an_npz_says_which_keys_it_read_and_refuses_bag_arrays_named_otherwise(tmp_path):
    """Arrays named idx and offs are not the dlrm_datasets layout: read flat, offs would be a
    table of indices; refused naming the keys. Flat arrays are read, and said to be."""
    from characterize.workloads.traces import npz_layout

    config = WorkloadConfig(T=2, E=50, D=4, B=5, L=10, batches=2)
    bad = tmp_path / "bad.npz"
    np.savez(bad, idx=np.arange(100) % 50, offs=np.arange(0, 100, 10))
    with pytest.raises(WorkloadError, match="keys idx, offs: offs look like bag offsets"):
        load_trace(bad, config, rows=50)
    flat = tmp_path / "flat.npz"
    np.savez(flat, a=np.arange(100) % 50, b=np.arange(100) % 30)
    assert npz_layout(flat) == "keys a, b: one table's index array each, in that order"
    assert "keys a, b" in load_trace(flat, config, rows=50).description
