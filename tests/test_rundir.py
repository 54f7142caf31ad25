"""The run directory's declaration (characterize.rundir) against what the code writes: a
committed run and a fresh one hold only declared files, every table exactly its declared
columns; every step writes what the declaration says; docs/gpu.md's table is generated."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pandas as pd
import pytest

from characterize import pipeline
from characterize.rundir import ARTIFACTS, SOURCES, artifact, markdown_table, tables
from characterize.store import load_run
from tests.conftest import needs_tools, write_experiment

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "profiles" / "static-paper"


def _undeclared(run: Path) -> list[str]:
    """Files of a run directory that no artifact's path matches."""
    out = []
    for f in run.rglob("*"):
        if f.is_dir():
            continue
        rel = f.relative_to(run).as_posix()
        if not any(fnmatch.fnmatch(rel, a.path) or (a.format == "folder" and rel.startswith(a.path[:-1]))
                   or (a.key == "ncu" and rel.startswith("ncu/")) for a in ARTIFACTS.values()):
            out.append(rel)
    return out


def _check_schema(run_dir: Path) -> None:
    assert not _undeclared(run_dir)
    run = load_run(run_dir)
    for a in tables():
        df = run.table(a.key)
        if (run_dir / a.path).is_file():
            assert list(df.columns) == a.column_names, a.path
    meta = json.loads((run_dir / "meta.json").read_text())
    assert {"experiment", "started"} <= set(meta)


def test_every_artifact_is_declared_completely():
    for a in ARTIFACTS.values():
        assert a.source in SOURCES and a.meaning and a.format
        assert a.step == "run" or a.step in {s.name for s in pipeline.STEPS}, a.key
        if a.format == "csv":
            assert a.columns and len(set(a.column_names)) == len(a.columns)
            assert all(c.meaning for c in a.columns)
    with pytest.raises(KeyError, match="known: meta"):
        artifact("nonsense")


def test_every_step_writes_what_the_declaration_says():
    by_step = {s.name: set(s.writes) for s in pipeline.STEPS}
    for a in ARTIFACTS.values():
        if a.step != "run":
            assert a.key in by_step[a.step], f"{a.key} is declared as written by {a.step}"
    for step, keys in by_step.items():
        assert all(artifact(k).step == step or step in artifact(k).added_by for k in keys), step
    assert by_step["sweeps"] == {k for k, a in ARTIFACTS.items() if "sweeps" in a.added_by}


def test_the_committed_run_holds_only_declared_files_and_columns():
    if not COMMITTED.is_dir():
        pytest.skip("no committed run")
    _check_schema(COMMITTED)


@needs_tools
@pytest.mark.slow
def test_a_fresh_run_holds_only_declared_files_and_columns(tmp_path):
    exp = pipeline.load_experiment(str(write_experiment(tmp_path, variants=("base", "l2p", "warp"),
                                                        datasets=("medium",))))
    outcome = pipeline.run_experiment(exp, tmp_path / "run", backend="emulate")
    assert outcome.steps["bench"] == "done", outcome.steps
    _check_schema(outcome.path)
    assert not load_run(outcome.path).bench.empty


def test_the_model_writes_the_declared_prediction_columns():
    from characterize.analysis.model.predict import COLUMNS

    assert COLUMNS == artifact("predictions").column_names


def test_the_readme_table_is_generated_from_the_declaration():
    page = (ROOT / "docs" / "gpu.md").read_text()
    assert markdown_table() in page, "regenerate docs/gpu.md's run-directory table with rundir.markdown_table()"


def test_a_table_the_declaration_lacks_cannot_be_read_by_key(tmp_path):
    run = load_run(COMMITTED) if COMMITTED.is_dir() else None
    if run is None:
        pytest.skip("no committed run")
    with pytest.raises(KeyError):
        run.table("nonsense")
    assert isinstance(run.table("predictions"), pd.DataFrame)
