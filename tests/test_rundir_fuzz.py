"""Fuzzed run-directory and calibration readers (issue 26): every file a run directory
holds (meta.json, point files, locality.json, the CSV tables) and stored calibrations,
byte-mutated, cut short, of the wrong JSON type, with text where numbers belong. The
only acceptable outcomes are a run whose frames hold what their declaration says, or a
one-line CharacterizeError naming the file. Seeded, a few seconds;
`python benchmarks/fuzz_readers.py` runs the same generators for longer."""

from __future__ import annotations

import json
import math
import random
import shutil
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import pytest

from characterize.analysis.model.constants import BOUNDS, ModelConstants, calibration_path, load_calibration
from characterize.config import ExperimentConfig
from characterize.errors import CharacterizeError
from characterize.hardware.specs import gpu_spec
from characterize.measure.runner import _stale_points
from characterize.rundir import artifact
from characterize.store import RunDir, load_run, run_fingerprint

COMMITTED = Path(__file__).resolve().parents[1] / "profiles" / "static-paper"
#: values a type swap puts where a JSON value was
ODD_VALUES: tuple[Any, ...] = ([1, 2], {"x": [1]}, "text", "", 12, -1, 1e308, float("nan"), None, True, [], {},
                               "\x1b]0;title\x07", 10**25)


def valid_run(d: Path) -> Path:
    """A small complete run directory: the committed run's files (its long tables cut to a
    few rows) plus bench points (two finished, one failed) and a failed profile point."""
    run = d / "run"
    shutil.copytree(COMMITTED, run)
    for name in ("predictions.csv", "e2e.csv"):
        pd.read_csv(run / name).head(12).to_csv(run / name, index=False)
    meta = json.loads((run / "meta.json").read_text())
    meta["fingerprint"] = run_fingerprint(ExperimentConfig.from_dict(meta["experiment"]), "cuda", "a100-80gb")
    (run / "meta.json").write_text(json.dumps(meta))
    rd = RunDir(run)
    for v, us in (("base", 101.5), ("rpf", 63.25)):
        rd.write_point("bench", v, "medium", {
            "status": "ok", "backend": "cuda", "gpu": "NVIDIA A100-SXM4-80GB", "params": {},
            "summary": [{"mode": "steady", "per_table_us": us, "ci95_us": 0.5, "reps": 12}],
            "repetitions": [{"mode": "steady", "rep": i, "kernel_us": us * 12, "prepass_us": 0.0} for i in range(3)]})
    rd.write_point("bench", "warp", "medium", {"status": "failed", "error": "worker died"})
    rd.write_point("profile", "base", "medium", {"status": "failed", "error": "ncu crashed"})
    return run


def _files(run: Path) -> list[Path]:
    return [run / "meta.json", run / "locality.json", *sorted((run / "points").rglob("*.json")),
            *(run / a.path for a in (artifact(k) for k in ("static", "sass", "predictions", "e2e",
                                                             "model_validation")))]


def _swap(obj: Any, rng: random.Random) -> Any:
    """`obj` with one value somewhere inside it (or itself) replaced by an odd one, or one
    key dropped."""
    if isinstance(obj, dict) and obj and rng.random() < 0.8:
        key = rng.choice(list(obj))
        if rng.random() < 0.15:
            return {k: v for k, v in obj.items() if k != key}
        return {**obj, key: _swap(obj[key], rng)}
    if isinstance(obj, list) and obj and rng.random() < 0.8:
        i = rng.randrange(len(obj))
        return [*obj[:i], _swap(obj[i], rng), *obj[i + 1:]]
    return rng.choice(ODD_VALUES)


def _mutate(path: Path, rng: random.Random) -> str:
    """Damage one file in place; returns how."""
    raw = path.read_bytes()
    how = rng.choice(["flip", "truncate", "type", "type", "type", "empty", "cell"])
    if path.suffix == ".csv" and how == "type":
        how = "cell"
    if path.suffix == ".json" and how == "cell":
        how = "type"
    if how == "flip":
        b = bytearray(raw)
        for _ in range(rng.choice([1, 2, 8])):
            b[rng.randrange(len(b))] = rng.randrange(256)
        path.write_bytes(bytes(b))
    elif how == "truncate":
        path.write_bytes(raw[:rng.randrange(len(raw))])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "type":
        path.write_text(json.dumps(_swap(json.loads(raw), rng)))
    else:   # a CSV cell replaced: text, an escape sequence, a huge number, nothing
        df = pd.read_csv(path)
        r, c = rng.randrange(len(df)), rng.randrange(len(df.columns))
        df = df.astype(object)
        df.iat[r, c] = rng.choice(["abc", "\x1b[2J", "1e999", "", "²", "-inf", "1,5"])
        if rng.random() < 0.2:
            df = df.drop(columns=df.columns[c])
        df.to_csv(path, index=False)
    return how


def rundir_mutants(work: Path, seed: int, n: int) -> Iterator[tuple[str, Path]]:
    """(file:how, run directory) with one file damaged; the file is restored when the
    consumer asks for the next mutant."""
    rng = random.Random(seed)
    run = valid_run(work)
    files = _files(run)
    for _ in range(n):
        f = rng.choice(files)
        original = f.read_bytes()
        how = _mutate(f, rng)
        yield f"{f.relative_to(run)}:{how}", run
        f.write_bytes(original)


def read_run_fully(run_dir: Path) -> None:
    """Everything the Python API gives of a run, with what the declaration promises."""
    run = load_run(run_dir)
    assert isinstance(run.meta, dict) and isinstance(run.meta["experiment"], dict)
    for key in ("static", "sass", "predictions", "e2e", "model_validation"):
        df = run.table(key)
        for col in artifact(key).columns:
            if col.unit and col.name in df.columns:
                assert pd.api.types.is_numeric_dtype(df[col.name]) or df[col.name].isna().all(), (key, col.name)
    loc = run.locality
    for col in ("lookups", "unique_rows"):
        if col in loc.columns:
            assert pd.api.types.is_numeric_dtype(loc[col]), col
    b = run.bench
    if not b.empty and "per_table_us" in b.columns:
        assert pd.api.types.is_numeric_dtype(b["per_table_us"]) or b["per_table_us"].isna().all()
    run.timings  # noqa: B018
    writer = RunDir(run_dir)   # what a resume reads: which points are finished, which measured otherwise
    for kind in ("bench", "profile"):
        for p in sorted(run_dir.glob(f"points/{kind}/*.json")):
            variant, _, dataset = p.stem.partition("__")
            writer.has_point(kind, variant, dataset)
    _stale_points(run_dir, run.meta.get("fingerprint"))
    f = run.failures
    assert isinstance(f, pd.DataFrame) and (f.empty or {"kind", "error"} <= set(f.columns))
    run.summary()


def calibration_mutants(work: Path, seed: int, n: int) -> Iterator[tuple[str, str]]:
    """(how, GPU key) with that GPU's stored calibration damaged (CHARACTERIZE_CALIBRATION
    must point under `work`)."""
    rng = random.Random(seed)
    spec = gpu_spec("a100-80gb")
    path = calibration_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    good = json.dumps({"gpu": spec.key, "constants": ModelConstants.defaults(spec).to_dict(), "points": 12})
    for _ in range(n):
        path.write_text(good)
        how = _mutate(path, rng)
        yield how, spec.key


def read_calibration(gpu: str) -> None:
    consts = load_calibration(gpu)
    if consts is not None:
        for name, (lo, hi) in BOUNDS.items():
            v = getattr(consts, name)
            assert math.isfinite(v) and lo <= v <= hi, (name, v)


def outcome(fn: Callable[[], object]) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except CharacterizeError as e:
        assert "\n" not in str(e) and str(e).strip(), repr(str(e))
        return type(e).__name__
    return "ok"


def test_damaged_run_directory_files_are_read_or_refused_by_file(tmp_path):
    seen = Counter()
    for how, run in rundir_mutants(tmp_path, seed=26, n=60):
        try:
            seen[outcome(lambda: read_run_fully(run))] += 1
        except Exception as e:  # noqa: BLE001 - the failure this test exists to find
            pytest.fail(f"{how}: {type(e).__name__}: {e}")
    assert seen["ok"] and seen["RunDirError"], seen


def test_damaged_calibrations_are_loaded_only_when_every_constant_is_in_range(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARACTERIZE_CALIBRATION", str(tmp_path / "calibration"))
    seen = Counter()
    for how, gpu in calibration_mutants(tmp_path, seed=26, n=40):
        try:
            seen[outcome(lambda: read_calibration(gpu))] += 1
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"{how}: {type(e).__name__}: {e}")
    assert seen["ConfigError"], seen
