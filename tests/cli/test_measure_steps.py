"""`characterize bench` and `profile` run the pipeline's own steps (open_step, bench_step,
profile_step): what is missing is said before a run directory is made, and a step run alone
leaves its failed points' error to the command, which prints what was measured first."""

from __future__ import annotations

import pytest

from characterize import pipeline
from characterize.errors import NcuNotFound, NoCudaDevice, PointsFailed, SchedulerError
from characterize.hardware.devices import devices
from tests.conftest import write_experiment


def test_open_step_says_what_is_missing_before_it_makes_a_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no Slurm client
    monkeypatch.setenv("CHARACTERIZE_NCU", str(tmp_path / "nope"))
    exp = pipeline.load_experiment(str(write_experiment(tmp_path, variants=("base",), datasets=("random",))))
    out = tmp_path / "run"
    with pytest.raises(NcuNotFound, match="CHARACTERIZE_NCU"):   # ncu before Slurm
        pipeline.open_step(exp, out, "profile", executor="slurm")
    with pytest.raises(NcuNotFound, match="given explicitly"):   # and before the GPU
        pipeline.open_step(exp, out, "profile", ncu=str(tmp_path / "nope"))
    with pytest.raises(SchedulerError, match="no sbatch"):   # Slurm before the GPU
        pipeline.open_step(exp, out, "bench", executor="slurm")
    if not devices():
        with pytest.raises(NoCudaDevice):
            pipeline.open_step(exp, out, "bench")
    assert not out.exists()


@pytest.mark.slow
def test_a_step_run_alone_returns_its_counts_and_a_run_s_step_raises(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\n5000\n")  # 5000 is outside E=1009
    exp = pipeline.load_experiment(str(write_experiment(tmp_path, variants=("base",), datasets=("medium", str(bad)))))
    said: list[str] = []
    ctx = pipeline.open_step(exp, tmp_path / "run", "bench", backend="emulate", reporter=said.append)
    counts = pipeline.bench_step(ctx, alone=True)
    assert (counts["ok"], counts["failed"]) == (1, 1)
    assert f"bench tiny: 2 point(s) to time into {tmp_path / 'run'} (backend emulate)" in said
    assert any(line.startswith("bench: 1 point(s) done, 1 failed") for line in said), said
    with pytest.raises(PointsFailed, match="1 of 2 bench point"):
        pipeline.raise_unfinished(ctx, "bench", counts)
    said.clear()
    ctx = pipeline.open_step(exp, tmp_path / "run", "bench", resume=True, backend="emulate", reporter=said.append)
    with pytest.raises(PointsFailed, match="every one of the 1 of 1 bench point"):   # the failed point again
        pipeline.bench_step(ctx)
    assert not any("point(s) to time into" in line for line in said)
    assert any(line.startswith("bench (CPU emulation): 0 point(s) done, 1 failed") for line in said), said
