"""Measure stage, across machines: each point of a sweep as one job of a cluster scheduler.

`--executor slurm` submits one Slurm job array per stage through submitit: array task
i measures point i (one variant x dataset) on whatever node Slurm gives it and writes
the point into the shared run directory atomically, exactly as the local runner does.
The submitting process holds the directory's writer lock for the whole sweep and
watches the jobs; a job the scheduler ends before its point is written (cancelled,
preempted, timed out, node failure, out of memory) becomes a failed point carrying the
scheduler's state and reason, and `--resume` submits only what is not finished.
`--executor local` is the single-machine runner (runner.py). Any submitit executor
runs the same orchestration: the fast tests use submitit's LocalExecutor, the slow
ones a real single-node Slurm (.ci/slurm-up.sh).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from characterize.config import ExperimentConfig, SlurmConfig
from characterize.errors import RunDirError, SchedulerError
from characterize.hardware.devices import devices
from characterize.measure.ncu import find_ncu
from characterize.measure.runner import ProfileSettings, bench_points, pending_points, profile_points
from characterize.measure.worker import run_bench
from characterize.progress import Progress
from characterize.progress import quiet as _quiet
from characterize.store import RunDir, load_run, read_json, write_atomic, write_json

try:  # a declared dependency; without it only --executor slurm is refused
    import submitit
    from submitit.core.utils import FailedJobError, FailedSubmissionError
except ImportError:  # pragma: no cover - exercised by the no-submitit message only
    submitit = None  # type: ignore[assignment]
    FailedJobError = FailedSubmissionError = RuntimeError  # type: ignore[assignment,misc]

EXECUTORS = ("local", "slurm")
#: folder of a run directory holding the job scripts, pickles and logs of submitted points
JOBS_DIR = "jobs"
#: Slurm states after which a job never runs again (anything else may still run)
SLURM_FINAL = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
               "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
#: seconds to wait for cancelled jobs of an earlier submission to be gone before submitting again
LEFTOVER_WAIT_S = 180.0
#: seconds after which a job the scheduler no longer lists counts as ended (state UNKNOWN)
UNKNOWN_AFTER_S = 60.0
#: submitit LocalJob states of a process that has ended
LOCAL_FINAL = {"FINISHED", "INTERRUPTED", "NO PROCESS AND NO RESULT"}



# ------------------------------------------------------------- in the task
@dataclass(frozen=True)
class PointTask:
    """What one array task measures; pickled by submitit and run on the node."""

    run_dir: str
    kind: str                   # bench | profile
    variant: str
    dataset: str
    backend: str | None         # None: cuda
    ncu: str | None = None      # profile: ncu as the node sees it (None: searched there)
    timeout_s: float = 900.0    # profile: seconds per ncu process


def gpu_identity(info: Any) -> dict[str, Any] | None:
    """The `gpu` entry of meta.json for a visible GPU (hardware.devices() item)."""
    if info is None:
        return None
    spec = info.spec()
    return {"name": info.name, "key": spec.key, "arch": info.arch, "sm_count": info.sm_count,
            "l2_bytes": info.l2_bytes, "memory_bytes": info.memory_bytes, "driver": info.driver,
            "cuda_runtime": info.cuda_runtime, "sm_clock_MHz": info.sm_clock_MHz,
            "max_sm_clock_MHz": info.max_sm_clock_MHz, "memory_clock_MHz": info.memory_clock_MHz,
            "hbm_GBps": spec.hbm_GBps}


def _job_name() -> str | None:
    """This task's scheduler id (12_3 for task 3 of array 12), if it runs under one."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '0')}"
    return env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID")


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM in a task (scancel, preemption, a node going down): stop now. submitit
    ignores SIGTERM to let checkpointable jobs save state; a point has none, and a task
    that ran on after its scancel could write its point beside a resubmitted one. No
    result is pickled, so the submitter records the scheduler's reason."""
    raise SystemExit(128 + signum)


def measure_point(task: PointTask) -> dict[str, Any]:
    """Measure one point inside a scheduler job and write it into the shared run
    directory (no lock taken: the submitting process holds it for the sweep). Returns
    where it ran, for meta.json."""
    path = Path(task.run_dir)
    run = RunDir(path)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)
    found = devices() if task.backend in (None, "cuda") else []
    if task.kind == "bench":
        run_bench(path, [(task.variant, task.dataset)], task.backend or "cuda")
    elif task.kind == "profile":
        exp = ExperimentConfig.from_dict(load_run(path).meta["experiment"])
        settings = ProfileSettings(find_ncu(task.ncu), task.timeout_s, task.backend)
        profile_points(run, exp, [(task.variant, task.dataset)], settings)
    else:
        raise SchedulerError(f"unknown point kind {task.kind!r}")
    where = {"executor": "slurm" if os.environ.get("SLURM_JOB_ID") else "submitit-local", "job": _job_name(),
             "host": platform.node()}
    run.annotate_point(task.kind, task.variant, task.dataset, ran_on=where)  # the point says where it was measured
    return {**where, "run_dir": str(path), "gpu": gpu_identity(found[0]) if found else None}


# ------------------------------------------------------------ submitting
def slurm_executor(folder: Path, cfg: SlurmConfig, backend: str | None, job_name: str,
                   where: dict[str, str] | None = None) -> Any:
    """A submitit SlurmExecutor for one stage's array: cfg's partition, constraint,
    time and setup (`where`: one GPU type's partition/constraint instead), GPUs only
    for the cuda backend. SchedulerError when Slurm or submitit is missing here."""
    require_slurm()
    where = where or {}
    params: dict[str, Any] = {"job_name": job_name, "time": cfg.time, "cpus_per_task": 1,
                              "signal_delay_s": min(90, max(10, cfg.time * 6)), "setup": list(cfg.setup)}
    partition = where.get("partition", cfg.partition)
    constraint = where.get("constraint", cfg.constraint)
    if partition:
        params["partition"] = partition
    if constraint:
        params["constraint"] = constraint
    if backend in (None, "cuda") and cfg.gpus_per_task > 0:
        params["gpus_per_task"] = cfg.gpus_per_task
    ex = submitit.SlurmExecutor(folder=folder, python=shlex.quote(sys.executable))
    ex.update_parameters(**params)
    return ex


def _sbatch_message(e: BaseException) -> str:
    """The line of a failed sbatch that says why (e.g. 'invalid partition specified')."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    said = [ln for ln in lines if "error" in ln.lower() and "sbatch" in ln.lower()]
    return (said or lines[-1:] or [type(e).__name__])[0]


def _query(cmd: Sequence[str]) -> list[list[str]]:
    """The '|'-separated fields of each line a Slurm query prints; none when it cannot
    run (a scheduler that does not answer is asked again at the next poll)."""
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip().split("|") for line in out.stdout.splitlines()]


def _slurm_states(array_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """State, reason, node and exit code of every task of the given arrays, as squeue
    lists them (finished jobs stay listed for the cluster's MinJobAge)."""
    if not array_ids:
        return {}
    cmd = ["squeue", "--array", "--states=all", "--noheader", "--format=%i|%T|%r|%N", "--jobs", ",".join(array_ids)]
    states = {}
    for parts in _query(cmd):
        if len(parts) == 4:
            states[parts[0]] = {"state": parts[1].split()[0], "reason": parts[2], "node": parts[3]}
    return states


def _sacct_states(job_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """sacct's view of finished jobs that squeue forgot (clusters with accounting)."""
    if not job_ids or shutil.which("sacct") is None:
        return {}
    cmd = ["sacct", "--parsable2", "--noheader", "--format=JobID,State,Reason,NodeList,ExitCode", "--jobs",
           ",".join(job_ids)]
    states = {}
    for parts in _query(cmd):
        if len(parts) >= 5 and "." not in parts[0]:
            states[parts[0]] = {"state": parts[1].split()[0], "reason": parts[2], "node": parts[3],
                                "exit_code": parts[4]}
    return states


@dataclass
class _Point:
    variant: str
    dataset: str
    job: Any
    run: RunDir
    kind: str
    label: str = ""          # the GPU type, with several
    final_seen: int = 0      # polls that saw the job ended without its result
    unknown: int = 0         # polls in which the scheduler listed no such job
    done: bool = False


def _job_state(p: _Point, slurm: dict[str, dict[str, str]]) -> tuple[bool, dict[str, str]]:
    """(ended, scheduler facts) of one point's job."""
    if submitit is not None and isinstance(p.job, submitit.SlurmJob):
        facts = slurm.get(p.job.job_id)
        if facts is None:
            return False, {"state": "UNKNOWN"}
        return facts["state"] in SLURM_FINAL, facts
    state = str(p.job.state)
    return state in LOCAL_FINAL, {"state": state}


def _outcome(job: Any) -> tuple[str, Any] | None:
    """submitit's result pickle of a job: ('success', value) | ('error', traceback) | None."""
    path = job.paths.result_pickle
    if not path.is_file():
        return None
    try:
        return submitit.core.utils.pickle_load(path)
    except (EOFError, OSError, ValueError):
        return None


def _scontrol_facts(job_id: str) -> dict[str, str]:
    """State, reason, exit code (status:signal) and node of one job from `scontrol show job`."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    names = {"JobState": "state", "Reason": "reason", "ExitCode": "exit_code", "NodeList": "node"}
    return {ours: fields[theirs] for theirs, ours in names.items() if fields.get(theirs) not in (None, "(null)")}


#: the line slurmstepd writes into a job's stderr when it ends a job (time limit, preemption, node failure)
_STEPD = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ (.*?) \*\*\*")


def _scheduler_reason(p: _Point, facts: dict[str, str]) -> str:
    """Why the scheduler ended a job that wrote no result, in its own words: its state,
    reason and exit code, and the line slurmstepd wrote into the job's log."""
    slurm = submitit is not None and isinstance(p.job, submitit.SlurmJob)
    if slurm:
        facts.update({k: v for k, v in _scontrol_facts(p.job.job_id).items() if v})
    kind = "Slurm job" if slurm else "job"
    text = f"{kind} {p.job.job_id} ended {facts.get('state', 'UNKNOWN')}"
    try:
        said = _STEPD.findall(p.job.paths.stderr.read_text(errors="replace")) if p.job.paths.stderr.is_file() else []
    except OSError:
        said = []
    if said:
        text += f": {said[-1]}"
    extra = [f"{k.replace('_', ' ')} {facts[k]}" for k in ("reason", "exit_code") if facts.get(k) not in
             (None, "", "None", "0:0")]
    if facts.get("node"):
        extra.append(f"on {facts['node']}")
    if extra:
        text += f" ({', '.join(extra)})"
    return text + f" before writing its point; job log: {p.job.paths.stderr}"


def _cancel(points: Sequence[_Point]) -> None:
    for p in points:
        if not p.done:
            try:
                p.job.cancel(check=False)
            except (OSError, subprocess.SubprocessError):
                pass


def _cancel_leftovers(folder: Path, run: RunDir) -> None:
    """Jobs of an earlier submission to this run that are still queued or running (its
    submitter was killed): cancelled, so a resumed sweep never measures beside them."""
    record = folder / "submitted.json"
    if not record.is_file() or shutil.which("squeue") is None:
        return
    try:   # written by us, but a damaged record costs only the clean-up, never the sweep
        ids = [str(i) for i in json.loads(record.read_text()).get("slurm_arrays", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return
    live = {k: v for k, v in _slurm_states(ids).items() if v["state"] not in SLURM_FINAL}
    if live:
        arrays = sorted({k.split("_")[0] for k in live})
        subprocess.run(["scancel", *arrays], capture_output=True, timeout=60)
        deadline = time.monotonic() + LEFTOVER_WAIT_S  # until their processes are gone (KillWait)
        while time.monotonic() < deadline and any(v["state"] not in SLURM_FINAL
                                                  for v in _slurm_states(arrays).values()):
            time.sleep(1.0)
        run.log(f"cancelled {len(live)} job(s) of an earlier submission still queued or running "
                f"(arrays {', '.join(arrays)})")


def _submit(run: RunDir, kind: str, points: Sequence[tuple[str, str]], executor: Any,
            task: Callable[[str, str], PointTask], progress: Progress, label: str = "") -> list[_Point]:
    """One job per point, as one array of `executor`; SchedulerError when refused."""
    try:  # submitit echoes a failed sbatch's stderr; the error below says it in one line instead
        with contextlib.redirect_stderr(io.StringIO()), executor.batch():
            jobs = [executor.submit(measure_point, task(v, d)) for v, d in points]
    except (FailedJobError, FailedSubmissionError, subprocess.SubprocessError, OSError) as e:
        raise SchedulerError(f"the scheduler refused the {kind} jobs: {_sbatch_message(e)}") from None
    except ValueError as e:  # submitit's own parameter check
        raise SchedulerError(f"bad scheduler parameter: {str(e).splitlines()[0]}") from None
    arrays = _arrays(jobs)
    if arrays:
        write_json(Path(executor.folder) / "submitted.json", {"kind": kind, "slurm_arrays": arrays})
    run.log(f"{kind}: submitted {len(points)} point(s) as job(s) {', '.join(arrays) or jobs[0].job_id}...")
    where = f" for GPU type {label}" if label else ""
    progress(f"{kind}: {len(points)} point(s) submitted{where}" +
             (f" as Slurm array {', '.join(arrays)}" if arrays else ""))
    return [_Point(v, d, j, run, kind, label) for (v, d), j in zip(points, jobs)]


def _arrays(jobs: Sequence[Any]) -> list[str]:
    """The Slurm array ids of `jobs` (none for other executors)."""
    if submitit is None or not jobs or not isinstance(jobs[0], submitit.SlurmJob):
        return []
    return sorted({j.job_id.split("_")[0] for j in jobs})


def _wait(pending: list[_Point], progress: Progress, poll_s: float) -> dict[str, Any]:
    """Wait for every job; a job that ended without writing its point leaves a failed
    point with the scheduler's reason (an `ok` point already written is kept). Ctrl-C
    cancels the jobs still queued or running; finished points stay."""
    counts: dict[str, Any] = {"ok": 0, "failed": 0, "ran": []}
    arrays = _arrays([p.job for p in pending])
    done = 0
    try:
        while any(not p.done for p in pending):
            slurm = _slurm_states(arrays)
            forgotten = [p.job.job_id for p in pending if not p.done and arrays and p.job.job_id not in slurm]
            slurm.update(_sacct_states(forgotten))
            for p in pending:
                if p.done:
                    continue
                ended, facts = _job_state(p, slurm)
                p.unknown = p.unknown + 1 if facts.get("state") == "UNKNOWN" else 0
                ended = ended or p.unknown * poll_s >= UNKNOWN_AFTER_S
                outcome = _outcome(p.job)
                if outcome is None and not ended:
                    continue
                if outcome is None and p.final_seen < 1:  # the result file may trail the state by a poll
                    p.final_seen += 1
                    continue
                p.done = True
                done += 1
                run, kind = p.run, p.kind
                ok = run.has_point(kind, p.variant, p.dataset)
                if outcome is not None and outcome[0] == "success":
                    counts["ran"].append(outcome[1])
                if not ok:
                    if outcome is None:
                        error = _scheduler_reason(p, facts)
                    elif outcome[0] == "error":
                        last = [ln for ln in str(outcome[1]).splitlines() if ln.strip()]
                        said = last[-1] if last else "an error"
                        if "UncompletedJobError" in said:  # submitit caught Slurm's warning signal
                            error = f"Slurm stopped job {p.job.job_id} before its point was written " \
                                    f"({said.split(': ', 1)[-1]}); a longer --slurm-time (slurm.time) lets it " \
                                    f"finish (job log: {p.job.paths.stderr})"
                        else:
                            error = f"job {p.job.job_id} raised: {said} (job log: {p.job.paths.stderr})"
                    else:
                        error = None  # the task wrote a failed point itself, with its reason
                    if error is not None:
                        run.write_point(kind, p.variant, p.dataset, {
                            "status": "failed", "error": error,
                            "scheduler": {"job": p.job.job_id, **{k: v for k, v in facts.items() if v}}})
                        run.log(f"{kind} {p.variant} {p.dataset}: failed: {error}")
                status = "ok" if ok else "FAILED: " + _point_error(run, kind, p)
                counts["ok" if ok else "failed"] += 1
                label = f" on {p.label}" if p.label else ""
                progress(f"[{done}/{len(pending)}] {p.variant} {p.dataset}{label}: {status} (job {p.job.job_id})")
            if any(not p.done for p in pending):
                time.sleep(poll_s)
    except KeyboardInterrupt:
        _cancel(pending)
        for run in {id(p.run): p.run for p in pending}.values():
            run.log("interrupted: queued and running jobs cancelled; finished points are kept (resume with --resume)")
        raise
    return counts


def submit_points(run: RunDir, kind: str, points: Sequence[tuple[str, str]], executor: Any,
                  task: Callable[[str, str], PointTask], progress: Progress = _quiet,
                  poll_s: float = 2.0) -> dict[str, Any]:
    """Submit one job per point as one array of `executor` and wait for all of them.
    Returns counts of ok / failed points and where the jobs ran (`ran`: what the jobs
    that returned said)."""
    if not points:
        return {"ok": 0, "failed": 0, "ran": []}
    return _wait(_submit(run, kind, points, executor, task, progress), progress, poll_s)


def _point_error(run: RunDir, kind: str, p: _Point) -> str:
    try:
        return str(read_json(run.point_path(kind, p.variant, p.dataset), kind).get("error", "?")).splitlines()[0]
    except (OSError, ValueError, IndexError, RunDirError):
        return "no point written"


# --------------------------------------------------------------- dispatch
@dataclass(frozen=True)
class Placement:
    """How the points of a stage are run: here (local) or one Slurm array task each."""

    executor: str = "local"           # local | slurm
    backend: str | None = None        # worker backend: None/cuda on a GPU, emulate on the CPU
    ncu: str | None = None            # profile: the ncu executable (on the nodes, for slurm)
    timeout_s: float = 900.0          # profile: seconds per point
    where: dict[str, str] | None = None  # slurm: one GPU type's partition/constraint
    deadline: float | None = None     # local: time.monotonic() at which measuring stops (a budget); the rest is cut

    def validate(self) -> "Placement":
        if self.executor not in EXECUTORS:
            raise SchedulerError(f"unknown executor {self.executor!r}; use {' or '.join(EXECUTORS)}")
        return self


def with_slurm_options(exp: ExperimentConfig, partition: str | None = None, gpus_per_task: int | None = None,
                       time_min: int | None = None) -> ExperimentConfig:
    """The experiment with the command line's --slurm-* options over its [slurm] section."""
    changes = {k: v for k, v in (("partition", partition), ("gpus_per_task", gpus_per_task), ("time", time_min))
               if v is not None}
    if not changes:
        return exp
    return replace(exp, slurm=replace(exp.slurm, **changes).validate())


def measure_points(run: RunDir, kind: str, exp: ExperimentConfig, points: Sequence[tuple[str, str]],
                   placement: Placement, progress: Progress = _quiet) -> dict[str, Any]:
    """Measure `points` of stage `kind` (bench | profile) where `placement` says; counts
    of ok / failed points. Slurm runs record the GPU their jobs saw in meta.json."""
    placement.validate()
    if placement.executor == "local":
        if kind == "bench":
            return bench_points(run, list(points), placement.backend, progress, timeout_s=exp.bench.timeout_s,
                                stall_s=exp.bench.stall_s, deadline=placement.deadline)
        backend = None if placement.backend in (None, "cuda") else placement.backend
        return profile_points(run, exp, list(points), ProfileSettings(find_ncu(placement.ncu), placement.timeout_s,
                                                                        backend, placement.deadline), progress)
    if not points:
        return {"ok": 0, "failed": 0, "ran": []}
    pending = _submit_slurm(run, kind, exp, points, placement, progress)
    counts = _wait(pending, progress, exp.slurm.poll) if pending else {"ok": 0, "failed": 0, "ran": []}
    _record_placement(run, exp, placement, counts["ran"])
    return counts


def _submit_slurm(run: RunDir, kind: str, exp: ExperimentConfig, points: Sequence[tuple[str, str]],
                  placement: Placement, progress: Progress, label: str = "") -> list[_Point]:
    folder = run.path / JOBS_DIR
    _cancel_leftovers(folder, run)
    points = [(v, d) for v, d in points if not run.has_point(kind, v, d)]  # finished by a leftover meanwhile
    if not points:
        return []
    ex = slurm_executor(folder, exp.slurm, placement.backend, f"chz-{kind}-{exp.name}", placement.where)
    backend = None if placement.backend in (None, "cuda") else placement.backend

    def task(v: str, d: str) -> PointTask:
        return PointTask(str(run.path.resolve()), kind, v, d, backend, placement.ncu, placement.timeout_s)

    return _submit(run, kind, points, ex, task, progress, label)


def _record_placement(run: RunDir, exp: ExperimentConfig, placement: Placement, ran: list[Any]) -> None:
    """meta.json: the GPU the jobs saw (when none is recorded yet), the partition,
    constraint and hosts the points ran on."""
    here = run.path.resolve()
    mine = [r for r in ran if isinstance(r, dict) and Path(str(r.get("run_dir", here))).resolve() == here]
    gpus = [r["gpu"] for r in mine if r.get("gpu")]
    meta = load_run(run.path).meta
    if gpus and not meta.get("gpu"):
        run.update_meta(gpu=gpus[0])
    where = placement.where or {}
    hosts = {r["host"] for r in mine if r.get("host")} | set((meta.get("executor") or {}).get("hosts", []))
    run.update_meta(executor={"kind": "slurm", "partition": where.get("partition", exp.slurm.partition),
                              "constraint": where.get("constraint", exp.slurm.constraint), "hosts": sorted(hosts)})


#: files of a run that every GPU type's run gets a copy of (computed once, GPU-independent)
SHARED_TABLES = ("static.csv", "sass.csv", "locality.json", "predictions.csv", "model_validation.csv", "e2e.csv")
#: folder of a run holding one run directory per GPU type (slurm.gpus)
GPUS_DIR = "gpus"


def gpu_type_runs(run: RunDir, exp: ExperimentConfig) -> list[tuple[str, RunDir]]:
    """One run directory per GPU type of `exp.slurm.gpus`, inside `run` (gpus/<type>/),
    each self-describing: the parent's meta with its own name and GPU type, and copies
    of the parent's GPU-independent tables (static, SASS, locality, predictions)."""
    meta = load_run(run.path).meta
    out = []
    for name in exp.slurm.gpus:
        path = run.path / GPUS_DIR / name
        sub_meta = {**{k: v for k, v in meta.items() if k not in ("started", "resumed", "gpu", "executor", "steps")},
                    "name": f"{meta.get('name', run.path.name)}-{name}", "gpu_type": name, "gpu": None}
        sub = RunDir.create(path, sub_meta, resume=True)
        for table in SHARED_TABLES:
            if (run.path / table).is_file():
                write_atomic(path / table, (run.path / table).read_bytes())
        out.append((name, sub))
    return out


def measure_stage(run: RunDir, kind: str, exp: ExperimentConfig, placement: Placement,
                  progress: Progress = _quiet) -> dict[str, Any]:
    """Measure every pending point of `kind`. With --executor slurm and several GPU types
    (slurm.gpus), every type's array is submitted at once, each to its own partition or
    constraint, into gpus/<type>/; then all are awaited. Counts over all types."""
    if placement.executor != "slurm" or not exp.slurm.gpus:
        return measure_points(run, kind, exp, pending_points(run, kind, exp), placement, progress)
    placement.validate()
    types = gpu_type_runs(run, exp)
    pending: list[_Point] = []
    try:
        for name, sub in types:
            points = pending_points(sub, kind, exp)
            if points:
                where = replace(placement, where=exp.slurm.gpus[name])
                pending += _submit_slurm(sub, kind, exp, points, where, progress, label=name)
    except SchedulerError:
        _cancel(pending)  # one type refused: the others' jobs are not left running unwatched
        raise
    counts = _wait(pending, progress, exp.slurm.poll) if pending else {"ok": 0, "failed": 0, "ran": []}
    for name, sub in types:
        _record_placement(sub, exp, replace(placement, where=exp.slurm.gpus[name]), counts["ran"])
    return counts


def require_slurm() -> None:
    """SchedulerError with the fix when Slurm cannot be reached from here."""
    if submitit is None:
        raise SchedulerError("--executor slurm needs the submitit package: pip install submitit")
    missing = [b for b in ("sbatch", "srun", "squeue", "scancel") if shutil.which(b) is None]
    if missing:
        raise SchedulerError(f"--executor slurm: no {', '.join(missing)} on PATH; run on a Slurm login node "
                             "(or use --executor local)")
