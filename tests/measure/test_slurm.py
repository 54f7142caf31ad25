"""A real Slurm: a single-node cluster (munged, slurmctld, slurmd) started by
.ci/slurm-up.sh, every point a real array task. `characterize run --executor slurm
--backend emulate` gives the local run's report; a job cancelled mid-run is a
failed point carrying Slurm's reason, and `--resume` finishes the run. Where the
cluster cannot start (no slurm-wlm/munge, not root) the tests skip and say why; CI
installs both, so there they run."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from characterize.store import load_run
from tests.conftest import fixtures_dir, write_experiment

ROOT = Path(__file__).resolve().parents[2]
UP = ROOT / ".ci" / "slurm-up.sh"
#: the test cluster answers at once: its runs look at the queue four times as often as the default
POLL = "poll = 0.5\n"


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    """The environment that reaches the test cluster: already running (CI starts it
    first), or started here and stopped after this module's tests."""
    env = dict(os.environ, CHZ_SLURM_CPUS=os.environ.get("CHZ_SLURM_CPUS", "4"))
    env["PATH"] = f"{env.get('PATH', '')}:/usr/sbin:/sbin"
    try:
        r = subprocess.run(["bash", str(UP)], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"Slurm test cluster did not start: {e}")
    if r.returncode != 0:
        pytest.skip((r.stderr.strip().splitlines() or [f"{UP} exited {r.returncode}"])[-1])
    conf = [ln.split("=", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("SLURM_CONF=")]
    env["SLURM_CONF"] = conf[-1]
    yield env
    if "slurm-up: started" in r.stderr:
        subprocess.run(["bash", str(UP), "stop"], capture_output=True, timeout=60, env=env)


def cli(env: dict[str, str], *args: object, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "characterize.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, **kw)


def squeue(env: dict[str, str], job: str) -> dict[str, str]:
    out = subprocess.run(["squeue", "--array", "--states=all", "--noheader", "--format=%i %T", "--jobs", job],
                         capture_output=True, text=True, env=env).stdout
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def report_content(path: Path, run_dir: Path) -> list[str]:
    """The report's text, every number masked (CPU-emulation timings differ from run to
    run, even between two local runs) and cells holding only a measurement dropped;
    the run's own path and the options that differ on its command line normalized."""
    html = path.read_text()
    html = re.sub(r"data:image/[^\"')]+", "", html)
    html = html.replace(str(run_dir), "RUN").replace(" --executor slurm", "").replace(" --resume", "")
    lines = []
    for ln in re.sub(r"<[^>]+>", "\n", html).splitlines():
        ln = re.sub(r"\d{4}-\d\d-\d\dT[\d:.+]+", "#", ln.strip())  # timestamps
        ln = re.sub(r"\d+(?:[.,]\d+)*", "#", ln)
        # "resumed": the provenance of the Slurm run says it was resumed (after the cancelled job)
        if ln and ln not in ("yes", "no", "resumed") and not re.fullmatch(r"[#\s±×%+\-–.,:/()]*", ln):
            lines.append(ln)
    return lines


def test_a_bad_partition_is_one_line(slurm_env, tmp_path):
    exp = write_experiment(tmp_path, variants=("base",), datasets=("random",), caps=())
    r = cli(slurm_env, "bench", exp, "--backend", "emulate", "--executor", "slurm", "--slurm-partition", "nope",
            "--out", tmp_path / "run")
    assert r.returncode == 10, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the scheduler refused the bench jobs: sbatch: error:") and "partition" in last
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_run_through_slurm_matches_the_local_run_and_resume_finishes_a_cancelled_job(slurm_env, tmp_path):
    start = time.monotonic()
    variants, datasets = ("torch", "warp"), ("medium", "random")
    n = len(variants) * len(datasets)
    exp = write_experiment(tmp_path, variants=variants, datasets=datasets, modes=("steady", "cold"), caps=(),
                           max_reps=3, budget=0.1)
    # the array's last task waits in its setup, so it is certainly running, without its point, when
    # the others have finished; a resubmitted point is task 0 of a new array and does not wait
    exp.write_text(exp.read_text() + f'\n[slurm]\nsetup = ["[ \\"$SLURM_ARRAY_TASK_ID\\" != {n - 1} ] || sleep 300"]\n{POLL}')
    local_dir, slurm_dir = tmp_path / "local" / "tiny", tmp_path / "slurm" / "tiny"
    # the local reference runs beside the Slurm run (bench budgets are wall time, so they overlap)
    local = subprocess.Popen([sys.executable, "-m", "characterize.cli", "run", str(exp), "--backend", "emulate",
                              "--out", str(local_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=slurm_env)
    proc = subprocess.Popen([sys.executable, "-m", "characterize.cli", "run", str(exp), "--executor", "slurm",
                             "--backend", "emulate", "--out", str(slurm_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=slurm_env)
    # wait for the bench array, let the other points finish, then cancel the waiting task
    record = slurm_dir / "jobs" / "submitted.json"
    cancelled = None
    deadline = time.monotonic() + 600
    while cancelled is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if not record.is_file():
            continue
        array = re.findall(r"\d+", record.read_text())[0]
        states = squeue(slurm_env, array)
        if sum(s == "COMPLETED" for s in states.values()) < n - 1:
            continue
        job = f"{array}_{n - 1}"
        if states.get(job) == "RUNNING":
            task = pickle.loads((slurm_dir / "jobs" / f"{job}_submitted.pkl").read_bytes()).args[0]
            assert not (slurm_dir / "points" / "bench" / f"{task.variant}__{task.dataset}.json").exists()
            subprocess.run(["scancel", job], check=True, env=slurm_env)
            cancelled = job
    out, err = proc.communicate(timeout=900)
    assert cancelled is not None, f"no running job to cancel: {err[-2000:]}"
    # a job that ended without its point fails the bench step (exit 9), the rest of the run is written
    assert proc.returncode == 9 and f"1 step(s) failed: bench: 1 of {n} bench point(s) failed" in err, err[-3000:]
    first = time.monotonic() - start
    run = load_run(slurm_dir)
    fail = run.failures
    assert len(fail) == 1, fail
    error = fail["error"].iloc[0]
    assert error.startswith(f"Slurm job {cancelled} ended CANCELLED") and "before writing its point" in error
    assert f"bench: failed: 1 of {n} bench point(s) failed" in out
    failed_point = (fail["variant"].iloc[0], fail["dataset"].iloc[0])

    resumed = cli(slurm_env, "run", exp, "--executor", "slurm", "--backend", "emulate", "--out", slurm_dir,
                  "--resume", timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1 point(s) submitted" in resumed.stderr
    run = load_run(slurm_dir)
    assert run.failures.empty
    exp_points = {(v, d) for v in run.meta["experiment"]["variants"] for d in run.meta["experiment"]["datasets"]}
    ok = {(p["variant"], p["dataset"]): p for p in run.points("bench") if p["status"] == "ok"}
    assert set(ok) == exp_points and len(exp_points) == n
    assert ok[failed_point]["ran_on"]["executor"] == "slurm" and ok[failed_point]["ran_on"]["job"] != cancelled
    assert run.meta["executor"]["kind"] == "slurm" and run.meta["executor"]["hosts"]

    lout, lerr = local.communicate(timeout=900)
    assert local.returncode == 0, lerr[-3000:]
    a = report_content(local_dir / "report.html", local_dir)
    b = report_content(slurm_dir / "report.html", slurm_dir)
    assert a == b
    print(f"\nSlurm run with one cancelled job: {first:.0f} s; resume {time.monotonic() - start - first:.0f} s")


@pytest.mark.slow
def test_two_gpu_types_are_measured_into_one_run_and_compared_side_by_side(slurm_env, tmp_path):
    exp = write_experiment(tmp_path, variants=("torch", "base"), datasets=("random",), caps=(), max_reps=3,
                           budget=0.1)
    # two "GPU types" of the test cluster: its two partitions, one also by the node's feature
    exp.write_text(exp.read_text() + f'\n[slurm]\ntime = 5\n{POLL}[slurm.gpus.first]\npartition = "debug"\n'
                   '[slurm.gpus.second]\npartition = "second"\nconstraint = "chz-emulate"\n')
    out = tmp_path / "run"
    r = cli(slurm_env, "run", exp, "--executor", "slurm", "--backend", "emulate", "--out", out, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    for name, partition in (("first", "debug"), ("second", "second")):
        sub = load_run(out / "gpus" / name)
        assert sub.name == f"run-{name}" and sub.meta["gpu_type"] == name
        assert sub.meta["executor"]["partition"] == partition
        assert {(p["variant"], p["status"]) for p in sub.points("bench")} == {("torch", "ok"), ("base", "ok")}
        assert not sub.static.empty and not sub.predictions.empty  # each type's run is self-describing
        script = next((out / "gpus" / name / "jobs").glob("*_submission.sh")).read_text()
        assert f"#SBATCH --partition={partition}" in script
    assert "--constraint=chz-emulate" in next((out / "gpus" / "second" / "jobs").glob("*_submission.sh")).read_text()
    html = (out / "report.html").read_text()
    assert "run-first, run-second" in html and "run-second vs run-first" in html


@pytest.mark.slow
def test_resume_after_the_submitter_was_killed_cancels_its_orphaned_jobs_first(slurm_env, tmp_path):
    exp = write_experiment(tmp_path, variants=("torch", "base", "warp"), datasets=("random",), caps=(),
                           max_reps=3, budget=0.1)
    # the first submission's jobs wait in their setup until the flag exists, so they are
    # still running when the resume starts, however fast the node is; the resubmitted ones do not wait.
    # A job says it waits (`waiting`) only once it has decided to: RUNNING alone is not enough, a
    # loaded node may start the setup's shell after the flag was set
    flag, waiting = tmp_path / "go", tmp_path / "waiting"
    exp.write_text(exp.read_text() + f'\n[slurm]\nsetup = ["[ -e {flag} ] || {{ touch {waiting}; sleep 300; }}"]\n{POLL}')
    out = tmp_path / "run"
    args = [sys.executable, "-m", "characterize.cli", "bench", str(exp), "--backend", "emulate", "--executor",
            "slurm", "--out", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=slurm_env)
    record = out / "jobs" / "submitted.json"
    deadline = time.monotonic() + 300
    while not record.is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.kill()  # the submitter dies; its array stays queued and running
    proc.wait()
    assert record.is_file()
    array = re.findall(r"\d+", record.read_text())[0]
    deadline = time.monotonic() + 120
    while not waiting.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert waiting.exists() and "RUNNING" in squeue(slurm_env, array).values()
    flag.touch()
    r = cli(slurm_env, *args[3:], "--resume", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(rf"cancelled \d+ job\(s\) of an earlier submission still queued or running \(arrays {array}\)",
                     (out / "log.txt").read_text())
    assert all(s not in ("PENDING", "RUNNING") for s in squeue(slurm_env, array).values())
    run = load_run(out)
    assert {p["variant"] for p in run.points("bench") if p["status"] == "ok"} == {"torch", "base", "warp"}


@pytest.mark.slow
def test_profile_through_slurm_runs_ncu_on_the_node(slurm_env, tmp_path):
    report = fixtures_dir() / "a100_mistic_msdnew.ncu-rep"
    if not report.is_file():
        pytest.skip(f"needs a real report recorded on a GPU ({report})")
    ncu = tmp_path / "bin" / "ncu"  # the stand-in runs the real profile target on the CPU backend
    ncu.parent.mkdir()
    ncu.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'fakes' / 'fake_ncu.py'} \"$@\"\n")
    ncu.chmod(0o755)
    env = dict(slurm_env, FAKE_NCU_LOG=str(tmp_path / "calls.jsonl"), FAKE_NCU_REPORT=str(report),
               CHARACTERIZE_BACKEND="emulate")
    exp = write_experiment(tmp_path, variants=("base",), datasets=("medium", "random"), caps=())
    exp.write_text(exp.read_text() + f"\n[slurm]\n{POLL}")
    out = tmp_path / "run"
    r = cli(env, "profile", exp, "--executor", "slurm", "--ncu", ncu, "--out", out, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run = load_run(out)
    pts = run.points("profile")
    assert [(p["dataset"], p["status"]) for p in pts] == [("medium", "ok"), ("random", "ok")]
    assert all(p["ran_on"]["executor"] == "slurm" for p in pts) and len({p["ran_on"]["job"] for p in pts}) == 2
    assert run.meta["ncu"]["path"] == str(ncu) and not run.metrics.empty
    assert len((tmp_path / "calls.jsonl").read_text().splitlines()) == 4  # per point: kernels, then cache counters
