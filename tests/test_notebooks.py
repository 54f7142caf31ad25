"""Every notebook runs top to bottom against the committed run (so none goes stale), shows
no raw tuples or NaN, and, on a run profiled on a GPU, reaches the variant's stalls."""

import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from characterize.kernels.registry import built_in

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
SASS_CSV = Path(__file__).parent / "data" / "sass_hot_loops.csv"


def execute(path: Path, env: dict[str, str]) -> list[str]:
    """Run a notebook with `env` set; the text of every output (errors fail the test)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [f"{o['ename']}: {o['evalue']}" for o in outputs if o.output_type == "error"]
    assert not errors, errors
    assert any(o.get("data", {}).get("image/png") for o in outputs)
    texts = [o.get("text", "") if o.output_type == "stream" else
             o.get("data", {}).get("text/plain", "") + o.get("data", {}).get("text/html", "") for o in outputs]
    shown = "\n".join(texts)
    assert not re.search(r"\bNaN\b|\bnan\b", shown), "a NaN reached the reader"
    assert not re.search(r"\[\('|\(\s*'[a-z_]+',\s*\d", shown), "a raw tuple reached the reader"
    return texts


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch):
    monkeypatch.delenv("CHARACTERIZE_RUN", raising=False)
    monkeypatch.delenv("CHARACTERIZE_NCU", raising=False)
    shown = "\n".join(execute(path, {}))
    assert re.search(rf"\buse ({'|'.join(built_in())})\b", shown)   # the answer first
    assert "PREDICTED by the model" in shown
    assert "rows in flight per warp" in shown and "reuse distance, median" in shown   # then why
    assert "Nothing was measured in this run" in shown


@pytest.mark.slow
def test_the_notebook_reaches_the_stalls_of_a_profiled_run(tmp_path, monkeypatch):
    from tests.report.test_report import make_gpu_run, profile_fixture

    if profile_fixture() is None:
        pytest.skip("needs the real A100 report for the profiled points")
    run = make_gpu_run(tmp_path / "a100", tmp_path, variants=("torch", "base", "l2p"), datasets=("medium",),
                       modes=("steady",), profile_report=profile_fixture(), failed_profile=None)
    shutil.copy(SASS_CSV, run / "sass.csv")
    shown = "\n".join(execute(NOTEBOOKS[0], {"CHARACTERIZE_RUN": str(run)}))
    assert "MEASURED with CUDA events" in shown and "profiled kernel(s) in the run" in shown
    assert "long scoreboard" in shown


def test_notebooks_exist_and_are_committed_without_outputs():
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name} has outputs"
