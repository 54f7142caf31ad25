"""Fuzzed report readers (issue 13): byte-mutated real Nsight Compute reports and
truncated, quote-broken and byte-flipped CSV exports. The only acceptable outcomes are a
correct result or a one-line ReportError (a CharacterizeError). Seeded and bounded to a
few seconds; `python benchmarks/fuzz_readers.py` runs the same generators for longer."""

from __future__ import annotations

import math
import random
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd
import pytest

from characterize.errors import CharacterizeError
from characterize.extract.ncu_csv import read_csv
from characterize.extract.ncu_rep import read_report
from characterize.extract.read import read_any, wide
from characterize.extract.rules import rule_results

CSV_DIR = Path(__file__).resolve().parents[1] / "data" / "ncu_csv"


def outcome(fn: Callable[[], object]) -> str:
    """'ok', or the error class of a one-line CharacterizeError; anything else fails."""
    try:
        fn()
    except CharacterizeError as e:
        text = str(e)
        assert "\n" not in text and text.strip(), repr(text)
        return type(e).__name__
    return "ok"


# ------------------------------------------------------------------ .ncu-rep
def mutate(raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One damaged copy: scattered byte flips, a truncation, or a zeroed range."""
    b = bytearray(raw)
    how = rng.choice(["flip", "flip", "truncate", "zero"])
    if how == "flip":
        for _ in range(rng.choice([1, 4, 16, 64, 256])):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif how == "truncate":
        b = b[: rng.randrange(len(b))]
    else:
        start = rng.randrange(len(b))
        end = min(len(b), start + rng.randrange(1, 4096))
        b[start:end] = bytes(end - start)
    return how, bytes(b)


def report_mutants(reports: list[Path], out: Path, seed: int, n: int,
                   only: int | None = None) -> Iterator[tuple[str, Path]]:
    """n damaged copies of `reports` (just the one numbered `only`, if given: same bytes)."""
    rng = random.Random(seed)
    for i in range(n):
        src = rng.choice(reports)
        how, data = mutate(src.read_bytes(), rng)
        if only is not None and i != only:
            continue
        p = out / f"{src.stem}-{seed}-{i}.ncu-rep"
        p.write_bytes(data)
        yield how, p


def read_report_fully(p: Path, out: Path) -> None:
    """What `import`, `report` and `compare` do with a report: every reader, and writing
    the strings out (a name that is not valid UTF-8 used to crash only here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = read_any(p)
        df.to_csv(out / "tidy.csv", index=False)
        wide(df).to_parquet(out / "wide.parquet")
        read_report(p, allow_partial=True).to_parquet(out / "partial.parquet")
        rule_results(p, allow_partial=True).to_csv(out / "rules.csv", index=False)


def test_byte_mutated_reports_read_or_fail_in_one_line(tmp_path, ncu_fixtures):
    counts = Counter()
    reports = [ncu_fixtures / "a100_mistic_msdnew.ncu-rep", ncu_fixtures / "a100_mistic_msdkt23.ncu-rep"]
    for how, p in report_mutants(reports, tmp_path, seed=13, n=40):
        counts[f"{how}:{outcome(lambda: read_report_fully(p, tmp_path))}"] += 1
    assert sum(counts.values()) == 40
    assert any(k.endswith(":ReportError") for k in counts) and any(k.endswith(":ok") for k in counts), counts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the crash probe forks (Linux)")
def test_a_report_that_crashes_nvidias_reader_is_a_one_line_error(tmp_path, ncu_fixtures):
    """This damaged H800 report makes ncu_report abort the process (a failed protobuf
    CHECK, SIGABRT); the read survives it and says so."""
    reports = sorted(ncu_fixtures.glob("*.ncu-rep"))
    [(how, p)] = report_mutants(reports, tmp_path, seed=2, n=66, only=65)
    assert p.name.startswith("h800_sglang")
    for read in (read_report, read_any, rule_results):
        with pytest.raises(CharacterizeError, match=r"corrupt: NVIDIA's report reader crashed on it \(SIGABRT\) "
                                                    r"\(ncu_report: Check failed"):
            read(p)


def test_a_report_damaged_after_its_first_result_keeps_the_others_when_partial(tmp_path, ncu_fixtures):
    raw = bytearray((ncu_fixtures / "a100_mistic_msdkt23.ncu-rep").read_bytes())
    needle = b"nodeByPoint5"
    last = raw.rfind(needle)
    raw[last + 4] = 0xFF
    p = tmp_path / "late.ncu-rep"
    p.write_bytes(bytes(raw))
    full = read_report(ncu_fixtures / "a100_mistic_msdkt23.ncu-rep")
    with pytest.raises(CharacterizeError, match="not valid UTF-8"):
        read_report(p)
    partial = read_report(p, allow_partial=True)
    assert 0 < partial["kernel_id"].nunique() < full["kernel_id"].nunique()


# ------------------------------------------------------------------------ CSV
def csv_mutants(seed: int, n: int, out: Path) -> Iterator[tuple[str, Path, Path]]:
    """(how, source, mutant): truncated at a random byte, a quote deleted or inserted, or byte flips."""
    rng = random.Random(seed)
    sources = sorted(CSV_DIR.glob("*.csv"))
    for i in range(n):
        src = rng.choice(sources)
        b = bytearray(src.read_bytes())
        how = rng.choice(["truncate", "quote-delete", "quote-insert", "flip"])
        if how == "truncate":
            b = b[: rng.randrange(len(b))]
        elif how == "quote-delete":
            del b[rng.choice([j for j, x in enumerate(b) if x == ord('"')])]
        elif how == "quote-insert":
            b.insert(rng.randrange(len(b)), ord('"'))
        else:
            for _ in range(rng.choice([1, 4, 16])):
                b[rng.randrange(len(b))] = rng.randrange(256)
        p = out / f"{src.stem}-{seed}-{i}.csv"
        p.write_bytes(bytes(b))
        yield how, src, p


def _values(df: pd.DataFrame) -> dict[tuple[int, str], tuple[float, str]]:
    return {(int(k), m): (v, t) for k, m, v, t in zip(df["kernel_id"], df["metric"], df["value"], df["value_text"])}


def csv_is_correct(src: Path, mutant: Path, how: str) -> bool:
    """A damaged export that reads must not invent anything: a truncated or quote-edited
    file yields a subset of the original's values. Byte flips may change a digit, so for
    them only the outcome counts."""
    got = _values(read_csv(mutant))
    if how == "flip":
        return True
    orig = _values(read_csv(src))
    for key, (value, text) in got.items():
        if key not in orig:
            return False
        ov, ot = orig[key]
        if not (value == ov or (math.isnan(value) and math.isnan(ov))) or text != ot:
            return False
    return True


def read_csv_fully(src: Path, p: Path, how: str) -> None:
    """Both CSV readers; AssertionError when the metrics read are not the original's."""
    assert csv_is_correct(src, p, how), f"{p} ({how}) read with values the original does not have"
    rule_results(p)


def test_truncated_and_quote_broken_csv_exports_are_correct_or_refused(tmp_path):
    counts = Counter()
    for how, src, p in csv_mutants(seed=13, n=240, out=tmp_path):
        counts[f"{how}:{outcome(lambda: read_csv_fully(src, p, how))}"] += 1
    assert sum(counts.values()) == 240
    assert counts["truncate:ReportError"] and counts["quote-delete:ReportError"], counts


def test_every_truncation_point_of_a_raw_page_is_correct_or_refused(tmp_path):
    src = CSV_DIR / "h800_sglang_raw.csv"
    raw = src.read_bytes()
    for cut in range(raw.index(b'"ID"') + 1, len(raw), 97):
        p = tmp_path / "cut.csv"
        p.write_bytes(raw[:cut])
        outcome(lambda: csv_is_correct(src, p, "truncate") or pytest.fail(f"cut at {cut} read wrongly"))
