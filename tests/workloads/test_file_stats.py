"""`workload stats FILE` reports the file as it is; the bench's circular consumption of
it only on request (--as-consumed); --lookups takes the file's first N or is refused."""

import json
from collections import Counter

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from characterize.cli import main
from characterize.config import Pooling, WorkloadConfig
from characterize.errors import ConfigError
from characterize.workloads.locality import source_locality
from characterize.workloads.traces import read_table

#: bench consumption of the small files below: 3 batches x 17 bags x 5 lookups = 255 per table
CONSUME = WorkloadConfig(T=4, E=1000, B=17, L=Pooling.parse("5"), batches=3)


def _coverage(seq, k):
    counts = sorted(Counter(seq).values(), reverse=True)
    return sum(counts[:k]) / len(seq)


@pytest.fixture
def stream(tmp_path):
    """An odd-length text stream, with a comment and a blank line, far shorter than the
    bench would read (101 lookups vs 255)."""
    seq = [int(x) for x in np.random.default_rng(3).zipf(1.3, 101) % 97]
    p = tmp_path / "odd.txt"
    p.write_text("# ids\n" + "\n".join(map(str, seq[:50])) + "\n\n" + "\n".join(map(str, seq[50:])) + "\n")
    return p, seq


def test_a_text_file_is_reported_as_it_is(stream):
    p, seq = stream
    res = source_locality(str(p), CONSUME, top_k=[1, 3, 10])
    s = res.stats
    assert res.view == "file" and res.file_lookups == 101 and res.tables_in_file == 1
    assert s.lookups == 101 and s.unique_rows == len(set(seq)) and res.rows == max(seq) + 1
    for k in (1, 3, 10):
        assert s.top_k_coverage[k] == pytest.approx(_coverage(seq, k))


def test_lookups_takes_the_first_n_or_is_refused(stream):
    p, seq = stream
    first = source_locality(str(p), CONSUME, lookups=37, top_k=[2])
    assert first.stats.lookups == 37 and first.stats.unique_rows == len(set(seq[:37]))
    assert first.stats.top_k_coverage[2] == pytest.approx(_coverage(seq[:37], 2))
    assert first.file_lookups == 101 and first.rows == max(seq) + 1  # E from the whole file, not the head
    with pytest.raises(ConfigError, match=r"holds 101 lookups; --lookups 102 asks for more.*--as-consumed"):
        source_locality(str(p), CONSUME, lookups=102)


def test_as_consumed_reads_the_file_circularly_as_the_bench_does(stream):
    p, seq = stream
    res = source_locality(str(p), CONSUME, as_consumed=True, top_k=[1])
    n = CONSUME.batches * CONSUME.B * 5
    circular = [seq[i % len(seq)] for i in range(n)]
    assert res.view == "consumed" and res.stats.lookups == n and res.file_lookups == 101
    assert res.stats.unique_rows == len(set(seq))
    assert res.stats.top_k_coverage[1] == pytest.approx(_coverage(circular, 1))
    more = source_locality(str(p), CONSUME, as_consumed=True, lookups=200)   # more than the file, within the bench
    assert more.stats.lookups == 200
    with pytest.raises(ConfigError, match=r"the bench reads 255 lookups of table 0.*raise --batches"):
        source_locality(str(p), CONSUME, as_consumed=True, lookups=256)


def test_every_table_of_a_2d_npy_and_an_npz_of_arrays(tmp_path):
    rng = np.random.default_rng(5)
    tables = rng.integers(0, 61, size=(3, 43)).astype(np.int32)
    np.save(tmp_path / "t.npy", tables)
    np.savez(tmp_path / "a.npz", t0=tables[0], t1=tables[1][:29], t2=tables[2][:7])
    for t in range(3):
        res = source_locality(str(tmp_path / "t.npy"), CONSUME, table=t)
        assert res.stats.lookups == 43 and res.stats.unique_rows == len(set(tables[t].tolist()))
        assert res.tables_in_file == 3
    assert source_locality(str(tmp_path / "a.npz"), CONSUME, table=2).stats.lookups == 7
    with pytest.raises(ConfigError, match=r"table 3 is not in the file, which holds 3 table\(s\)"):
        source_locality(str(tmp_path / "t.npy"), CONSUME, table=3)
    with pytest.raises(ConfigError, match=r"one stream of lookups.*--as-consumed"):
        np.save(tmp_path / "one.npy", tables[0])
        source_locality(str(tmp_path / "one.npy"), CONSUME, table=1)


def _bagged(rng, tables=2, bags=23):
    lengths = rng.integers(0, 9, size=(tables, bags))
    indices = rng.integers(0, 211, size=int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
    return indices, offsets, lengths


def test_bagged_files_give_each_table_all_its_bags(tmp_path):
    """dlrm_datasets layout: table 1's lookups are every index of its 23 bags, though the
    bench would take only B=17 of them per batch."""
    indices, offsets, lengths = _bagged(np.random.default_rng(8))
    np.savez(tmp_path / "b.npz", indices=indices, offsets=offsets, lengths=lengths)
    torch.save((torch.from_numpy(indices), torch.from_numpy(offsets), torch.from_numpy(lengths)), tmp_path / "b.pt")
    first = int(lengths[0].sum())
    mine = indices[first:].tolist()
    for name in ("b.npz", "b.pt"):
        ft = read_table(tmp_path / name, table=1)
        assert ft.file_lookups == len(mine) and ft.tables == 2 and ft.indices.tolist() == mine
        res = source_locality(str(tmp_path / name), CONSUME, table=1, rows=211)
        assert res.stats.lookups == len(mine) and res.stats.unique_rows == len(set(mine)) and res.rows == 211
        consumed = source_locality(str(tmp_path / name), CONSUME, table=1, rows=211, as_consumed=True)
        assert consumed.stats.lookups == int(lengths[1][:17].sum())   # one batch of the file's first 17 bags


def test_out_of_range_and_empty_files_are_named(tmp_path):
    (tmp_path / "big.txt").write_text("1\n2\n900\n")
    with pytest.raises(Exception, match=r"position 2: index 900 is out of range for 100 rows"):
        read_table(tmp_path / "big.txt", rows=100)
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    with pytest.raises(Exception, match=r"has no indices"):
        read_table(tmp_path / "empty.txt")


# ------------------------------------------------------------------ the CLI
def _run(*args):
    return CliRunner().invoke(main, ["workload", "stats", *map(str, args)])


def test_cli_reports_the_file_and_the_consumption_on_request(stream):
    p, seq = stream
    r = _run(p)
    assert r.exit_code == 0, r.output
    assert f"{p} (table 0): the file's 101 lookups, over {max(seq) + 1} rows" in r.output
    assert "--as-consumed shows what the bench reads" in r.output
    d = json.loads(_run(p, "--json", "--lookups", 11).output)
    assert (d["lookups"], d["view"], d["file_lookups"]) == (11, "file", 101)
    c = json.loads(_run(p, "--json", "--as-consumed", "--B", 17, "--L", 5, "--batches", 3).output)
    assert (c["lookups"], c["view"], c["file_lookups"]) == (255, "consumed", 101)
    t = _run(p, "--as-consumed", "--B", 17, "--L", 5, "--batches", 3)
    assert "255 lookups as the bench reads them (3 batches x B=17 x L=5, read circularly; the file holds 101)" \
        in t.output


def test_cli_refuses_more_lookups_than_the_file_in_one_line(stream):
    p, _ = stream
    r = _run(p, "--lookups", 5000)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines() == [
        f"error: {p}: table 0 holds 101 lookups; --lookups 5,000 asks for more. Ask for at most 101, or pass "
        "--as-consumed to read the file circularly as the bench does"]


def test_presets_are_unchanged_by_the_file_view():
    d = json.loads(_run("medium", "--E", 3001, "--lookups", 777, "--json").output)
    assert (d["lookups"], d["view"], d["file_lookups"]) == (777, "generated", None)


def test_reuse_distances_walked_in_chunks_match_one_pass_and_report_progress(monkeypatch):
    from characterize.workloads import locality

    seq = np.random.default_rng(11).integers(0, 41, 1001)
    whole = locality.reuse_distances(seq)
    monkeypatch.setattr(locality, "REUSE_CHUNK", 97)
    calls = []
    chunked = locality.reuse_distances(seq, progress=lambda done, n: calls.append((done, n)))
    assert np.array_equal(whole, chunked)
    assert calls[0] == (97, 1001) and calls[-1] == (1001, 1001) and len(calls) == 11
    last = {}
    for t, v in enumerate(seq.tolist()):   # the definition, for a few positions
        if t in (0, 96, 97, 500, 1000):
            assert chunked[t] == (len(set(seq[last[v] + 1:t].tolist())) if v in last else -1)
        last[v] = t
