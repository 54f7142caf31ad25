"""Shared fixtures: GPU and slow marker handling, fixture report location, a tiny workload."""

from __future__ import annotations

import compileall
import json
import os
from pathlib import Path

import pytest

# pytest-xdist runs one worker per core and the processes the tests start run beside them:
# one intra-op thread each, or idle OpenMP and OpenBLAS pools spin on the cores the other
# workers need (set before torch and numpy load, inherited by every subprocess)
for _pool in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")

import torch  # noqa: E402

from characterize.config import WorkloadConfig
from characterize.errors import ToolchainNotFound
from characterize.kernels.build import find_nvcc
from characterize.kernels.diskcache import cache_root
from characterize.kernels.sass import find_cuobjdump

HAS_GPU = torch.cuda.is_available()


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="also run tests marked slow (subprocess runs, the wheel install); CI does")


def pytest_configure(config):
    """The package's bytecode, written once before the tests start: the ~150 Python processes
    the subprocess tests start then read it instead of each compiling the package's source
    again (0.15 s of CPU each) where $PYTHONDONTWRITEBYTECODE keeps them from caching it."""
    if not hasattr(config, "workerinput"):   # the controller (or the only process), not each xdist worker
        compileall.compile_dir(Path(__file__).resolve().parents[1] / "characterize", quiet=2)


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the default options) on a machine with a GPU: one worker, so no two test
    files share the device and a timing test never runs beside another's kernels."""
    return 1 if HAS_GPU else None


#: the files that take longest (wall time, from an empty build cache), longest first. pytest-xdist
#: hands out whole files in collection order, so these go first: a long file handed out last
#: would be the run's tail on one core, and the ones that wait (on Slurm daemons, a browser,
#: killed processes) wait while the other workers compute. The rest keep their order.
START_FIRST = (
    "measure/test_slurm.py", "report/test_browser.py", "measure/test_runner.py", "report/test_report.py",
    "kernels/test_sass.py", "kernels/test_tbe.py", "kernels/test_training.py", "kernels/test_precision.py",
    "measure/test_hygiene.py", "test_hostile.py", "test_wheel.py", "test_pipeline.py",
    "analysis/test_validation.py",
)


def _start_rank(item) -> int:
    path = item.nodeid.split("::")[0].removeprefix("tests/")
    return START_FIRST.index(path) if path in START_FIRST else len(START_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_rank)   # stable: within a file, and among the rest, the collected order
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    skip_slow = pytest.mark.skip(reason="slow: run with --slow (CI does)")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not config.getoption("--slow"):
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch):
    """Tables fit $COLUMNS when it is set: tests see every column, whatever terminal (or
    pytest-xdist worker) runs them; a test about widths sets it itself."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """$CHARACTERIZE_CACHE at a folder of this test's own whose builds (and their locks) are
    the real cache's: nothing is compiled again, and what is kept beside the builds (the SASS
    text, nest replays, predictions and claims of kernels.diskcache) starts empty."""
    real, cache = cache_root(), tmp_path / "cache"
    cache.mkdir()
    for shared in ("build", "locks"):
        (real / shared).mkdir(parents=True, exist_ok=True)
        (cache / shared).symlink_to(real / shared, target_is_directory=True)
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(cache))
    return cache


def fixtures_dir() -> Path:
    """../shared/fixtures/ncu beside the repository, or $CHARACTERIZE_NCU_FIXTURES."""
    env = os.environ.get("CHARACTERIZE_NCU_FIXTURES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "ncu"


@pytest.fixture
def ncu_fixtures() -> Path:
    d = fixtures_dir()
    if not d.is_dir() or not list(d.glob("*.ncu-rep")):
        pytest.skip(f"real Nsight Compute reports not found in {d} (they live beside the repository)")
    return d


@pytest.fixture
def tiny() -> WorkloadConfig:
    return WorkloadConfig.tiny()


TINY_EXPERIMENT = """
name = "{name}"
description = "odd small shapes for harness and report tests"
datasets = {datasets}
variants = {variants}
archs = ["sm_80"]
maxrregcount = {caps}
[workload]
T = 2
E = 1009
D = 68
B = 127
L = "uniform:0:20"
batches = 2
seed = 7
[bench]
warmup = 1
min_reps = 3
max_reps = {max_reps}
budget_s = {budget}
modes = {modes}
[profile]
tables = {tables}
"""


def write_experiment(tmp: Path, name: str = "tiny", datasets=("medium", "random"),
                     variants=("torch", "base", "rpf", "l2p", "l2w", "warp"), modes=("steady",),
                     caps=(48,), max_reps: int = 4, budget: float = 0.3, tables: int = 1) -> Path:
    """A tiny experiment file (odd shapes, few repetitions) in `tmp`."""
    p = tmp / f"{name}.toml"
    p.write_text(TINY_EXPERIMENT.format(name=name, datasets=json.dumps(list(datasets)),
                                        variants=json.dumps(list(variants)), caps=json.dumps(list(caps)),
                                        max_reps=max_reps, budget=budget, modes=json.dumps(list(modes)),
                                        tables=tables))
    return p


def missing_cuda_tools() -> str | None:
    """Why nvcc or cuobjdump cannot be found here, or None when both can."""
    try:
        find_cuobjdump()
        find_nvcc()
    except ToolchainNotFound as e:
        return str(e)
    return None


#: tests that compile kernels and read their SASS
needs_tools = pytest.mark.skipif(missing_cuda_tools() is not None,
                                 reason=f"cuobjdump or nvcc missing: {missing_cuda_tools()}")


def assert_checks_pass(results, expected_to_run) -> None:
    """No check failed; a skipped one (passed None) says why (a shape the variant refuses by
    design, or an optional package missing here), and is not a failure; every variant in
    `expected_to_run` ran and passed at least once."""
    assert results, "no checks ran"
    failed = [r for r in results if r.passed is False]
    assert not failed, failed
    unexplained = [r for r in results if r.passed is None and not r.error.startswith("skipped: ")]
    assert not unexplained, unexplained
    ran = {r.variant for r in results if r.passed}
    assert set(expected_to_run) <= ran, sorted(set(expected_to_run) - ran)
