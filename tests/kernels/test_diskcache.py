"""The disk cache: an entry is computed once and read back after; a damaged entry is
computed again; a cache that cannot be written keeps nothing and still answers; the keys
are those the caches had before they shared the helper."""

import hashlib
import json

import pytest

from characterize.kernels import diskcache as D


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def counted(value):
    calls = []

    def compute():
        calls.append(1)
        return value
    return compute, calls


def test_an_entry_is_named_by_its_kind_and_key(cache):
    assert D.cache_root() == cache
    assert D.entry("sass/nest", "ab12", ".json") == cache / "sass" / "nest" / "ab12.json"
    # one SHA-256 over the parts in turn: the keys the SASS, binary and predictions caches had before
    assert D.entry_key(b"library bytes", "1 13.0.88") == hashlib.sha256(b"library bytes1 13.0.88").hexdigest()[:24]
    assert len(D.entry_key("x")) == D.KEY_DIGITS and D.entry_key("a", "b") == D.entry_key("ab")


def test_computed_once_then_read_back_as_a_later_call_reads_it(cache):
    compute, calls = counted({"bags": (1, 2.5)})
    kw = dict(read=lambda p: json.loads(p.read_text()), write=json.dumps, suffix=".json")
    first = D.get_or_compute("nest", "k", compute, **kw)
    assert first == {"bags": [1, 2.5]}   # the entry read back (JSON has no tuples), as the next call gets it
    assert D.get_or_compute("nest", "k", compute, **kw) == first and len(calls) == 1
    assert D.get_or_compute("nest", "k", compute, force=True, **kw) == first and len(calls) == 2


@pytest.mark.parametrize("damage", [lambda p: p.write_text('{"v": [1, '), lambda p: p.write_bytes(b"\xff\xfe"),
                                    lambda p: (p.unlink(), p.mkdir())])
def test_a_damaged_entry_is_computed_again(cache, damage):
    compute, calls = counted({"v": [1, 2]})
    kw = dict(read=lambda p: json.loads(p.read_text()), write=json.dumps, suffix=".json")
    assert D.get_or_compute("sass/nest", "k", compute, **kw) == {"v": [1, 2]}
    path = D.entry("sass/nest", "k", ".json")
    damage(path)
    assert D.read_entry(path, kw["read"]) is D.MISSING
    assert D.get_or_compute("sass/nest", "k", compute, **kw) == {"v": [1, 2]} and len(calls) == 2


def test_a_cache_that_cannot_be_written_keeps_nothing_and_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(blocker))
    compute, calls = counted("text")
    assert D.get_or_compute("binary", "k", compute, suffix=".txt", lock=True) == "text"
    assert D.get_or_compute("binary", "k", compute, suffix=".txt", lock=True) == "text"
    assert len(calls) == 2 and not D.write_entry(D.entry("binary", "k"), "x")


def test_a_locked_entry_takes_its_lock_beside_the_entries(cache):
    compute, calls = counted("csv")
    assert D.get_or_compute("claims", "k1", compute, suffix=".csv", lock=True) == "csv"
    assert D.get_or_compute("sass/nest", "k2", compute, lock=True) == "csv"
    assert sorted(p.name for p in (cache / "locks").iterdir()) == ["claims-k1.lock", "sass-nest-k2.lock"]


def test_the_source_digest_follows_every_file_below_its_root(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "a.py").write_text("x = 1\n")
    (tmp_path / "b.csv").write_text("a,b\n")
    first = D.source_digest(tmp_path, (".py", ".csv"))
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "c.py").write_text("ignored")
    (tmp_path / "notes.txt").write_text("not a suffix asked for")
    assert D.source_digest(tmp_path, (".py", ".csv")) == first
    (tmp_path / "model" / "a.py").write_text("x = 2\n")
    assert D.source_digest(tmp_path, (".py", ".csv")) != first
