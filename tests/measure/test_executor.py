"""The scheduler orchestration (measure/executor.py) without a cluster: submitit's
LocalExecutor runs each point as its own job process, exactly as a Slurm array task
would, on the CPU-emulation backend. A job killed from outside becomes a failed point
with the scheduler's word for it, and a resubmission of the pending points finishes
the run. The real Slurm runs are in test_slurm.py."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from pathlib import Path

import pytest
import submitit
from click.testing import CliRunner

from characterize.cli import main
from characterize.config import ExperimentConfig, SlurmConfig
from characterize.errors import ConfigError, SchedulerError
from characterize.measure.executor import (
    JOBS_DIR,
    PointTask,
    slurm_executor,
    submit_points,
    with_slurm_options,
)
from characterize.measure.runner import pending_points
from characterize.pipeline import load_experiment, open_experiment_run
from characterize.store import load_run
from tests.conftest import write_experiment


def _open(tmp_path: Path, variants=("torch", "base"), datasets=("random",)):
    exp = load_experiment(str(write_experiment(tmp_path, variants=variants, datasets=datasets, caps=(),
                                               max_reps=3, budget=0.1)))
    run = open_experiment_run(exp, tmp_path / "run", "bench", False, None, "emulate")
    return exp, run


def _local(run) -> submitit.LocalExecutor:
    ex = submitit.LocalExecutor(folder=run.path / JOBS_DIR)
    ex.update_parameters(timeout_min=10)
    return ex


def _task(run, kind: str = "bench"):
    return lambda v, d: PointTask(str(run.path), kind, v, d, "emulate")


def test_each_point_is_one_job_and_a_killed_job_is_a_failed_point_that_resume_finishes(tmp_path):
    exp, run = _open(tmp_path)
    points = pending_points(run, "bench", exp)
    assert points == [("torch", "random"), ("base", "random")]
    jobs_dir = run.path / JOBS_DIR
    killed: list[str] = []

    def kill_base_job() -> None:
        """SIGKILL the job measuring `base` as soon as its process exists (seconds before
        it can have written anything: it is still importing torch)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for sub in jobs_dir.glob("*_submitted.pkl"):
                try:
                    task = pickle.loads(sub.read_bytes()).args[0]
                except (EOFError, pickle.UnpicklingError, OSError):
                    continue
                if task.variant == "base":
                    pid = sub.name.split("_")[0]
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_base_job)
    killer.start()
    lines: list[str] = []
    counts = submit_points(run, "bench", points, _local(run), _task(run), lines.append, poll_s=0.2)
    killer.join()
    assert killed and counts["ok"] == 1 and counts["failed"] == 1
    r = load_run(run.path)
    fail = r.failures
    assert list(zip(fail["variant"], fail["dataset"])) == [("base", "random")]
    error = fail["error"].iloc[0]
    assert f"job {killed[0]} ended INTERRUPTED" in error and "before writing its point" in error
    assert any("base random: FAILED" in ln for ln in lines)
    ok = [p for p in r.points("bench") if p["status"] == "ok"]
    assert [p["variant"] for p in ok] == ["torch"] and ok[0]["ran_on"]["executor"] == "submitit-local"
    before = (run.path / "points" / "bench" / "torch__random.json").read_text()

    # the resubmission runs only the failed point, and leaves the finished one alone
    again = pending_points(run, "bench", exp)
    assert again == [("base", "random")]
    counts = submit_points(run, "bench", again, _local(run), _task(run), poll_s=0.2)
    assert counts["ok"] == 1 and counts["failed"] == 0
    r = load_run(run.path)
    assert r.failures.empty and set(r.bench["variant"]) == {"torch", "base"}
    assert (run.path / "points" / "bench" / "torch__random.json").read_text() == before
    assert "base random: failed: job" in (run.path / "log.txt").read_text()


def test_a_task_that_raises_is_a_failed_point_with_its_error(tmp_path):
    exp, run = _open(tmp_path, variants=("base",))
    counts = submit_points(run, "bench", [("base", "random")], _local(run), _task(run, kind="nonsense"), poll_s=0.2)
    assert counts == {"ok": 0, "failed": 1, "ran": []}
    err = load_run(run.path).failures["error"].iloc[0]
    assert "raised: characterize.errors.SchedulerError: unknown point kind 'nonsense'" in err
    assert str(run.path / JOBS_DIR) in err  # where the job's log is


def test_slurm_config_section_and_its_command_line_overrides(tmp_path):
    exp = ExperimentConfig.from_dict({"name": "x", "slurm": {"partition": "gpu", "time": 30, "setup": ["module load cuda"],
                                                            "gpus": {"a100": {"constraint": "a100"}}}})
    assert exp.validate().slurm == SlurmConfig(partition="gpu", time=30, setup=("module load cuda",),
                                               gpus={"a100": {"constraint": "a100"}})
    assert ExperimentConfig.from_dict(exp.to_dict()).slurm == exp.slurm  # survives meta.json
    over = with_slurm_options(exp, partition="h100", gpus_per_task=2, time_min=None)
    assert (over.slurm.partition, over.slurm.gpus_per_task, over.slurm.time) == ("h100", 2, 30)
    with pytest.raises(ConfigError, match="slurm.time is minutes per point"):
        with_slurm_options(exp, time_min=0)
    with pytest.raises(ConfigError, match="slurm.gpus.a100 takes partition and/or constraint, got gres"):
        ExperimentConfig.from_dict({"slurm": {"gpus": {"a100": {"gres": "gpu:a100:1"}}}}).validate()
    with pytest.raises(ConfigError, match="slurm.time must be an integer, got '30'"):
        ExperimentConfig.from_dict({"slurm": {"time": "30"}})
    assert ExperimentConfig.from_dict({"slurm": {"poll": 0.5}}).validate().slurm.poll == 0.5
    with pytest.raises(ConfigError, match="slurm.poll must be a finite number above 0.05"):
        ExperimentConfig.from_dict({"slurm": {"poll": 0}}).validate()


def test_slurm_executor_asks_for_what_the_config_says(tmp_path, monkeypatch):
    fake_bin = tmp_path / "bin"  # the submission is never run: only the script submitit would send
    fake_bin.mkdir()
    for b in ("sbatch", "srun", "squeue", "scancel"):
        (fake_bin / b).write_text("#!/bin/sh\nexit 1\n")
        (fake_bin / b).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    cfg = SlurmConfig(partition="gpu", time=20, constraint="a100", setup=("module load cuda",))
    script = slurm_executor(tmp_path, cfg, "cuda", "chz-bench-x")._make_submission_file_text("CMD", "u")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=20", "#SBATCH --constraint=a100",
                 "#SBATCH --gpus-per-task=1", "#SBATCH --job-name=chz-bench-x", "module load cuda"):
        assert line in script
    h100 = slurm_executor(tmp_path, cfg, "cuda", "j", where={"partition": "h100"})._make_submission_file_text("C", "u")
    assert "--partition=h100" in h100 and "--constraint=a100" in h100
    emulate = slurm_executor(tmp_path, cfg, "emulate", "j")._make_submission_file_text("C", "u")
    assert "gpus-per-task" not in emulate  # the CPU emulation needs no GPU


def test_no_slurm_here_is_one_line_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, srun, squeue, scancel
    with pytest.raises(SchedulerError, match="no sbatch, srun, squeue, scancel on PATH"):
        slurm_executor(tmp_path, SlurmConfig(), "emulate", "j")
    exp = write_experiment(tmp_path, variants=("base",), datasets=("random",), caps=())
    r = CliRunner().invoke(main, ["bench", str(exp), "--backend", "emulate", "--executor", "slurm",
                                  "--out", str(tmp_path / "run")])
    assert r.exit_code == SchedulerError.exit_code
    assert r.output.strip().splitlines()[-1].startswith("error: --executor slurm: no sbatch")
    assert "Traceback" not in r.output and not (tmp_path / "run").exists()
