"""Measure stage, supervising side: bench and profile an experiment into a run directory.

Timing runs in a worker process that writes every finished point at once; when the
worker dies (kernel fault, out of memory, a kill), the point it was working on is
recorded as failed with the reason and a fresh worker continues with the rest.
Profiling runs every point under one Nsight Compute process where NVTX scoping allows
(the points share the report; each dataset's trace is loaded once), and their cache
counters in one more; a point that cannot be attributed gets a process of its own. An
interrupted profile keeps every finished report. Nothing already measured is ever redone
unless asked.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from characterize.config import ExperimentConfig
from characterize.errors import (
    CharacterizeError,
    NcuError,
    NcuPermissionError,
    PointsFailed,
    RunDirError,
)
from characterize.extract.ncu_rep import read_report
from characterize.hardware.devices import devices
from characterize.kernels.registry import get_variant
from characterize.measure.ncu import (
    CACHE_REPLAY_MODE,
    CACHE_SINGLE_PASS_MODE,
    NcuOptions,
    build_argv,
    cache_argv,
    export_path,
    ncu_version,
    replay_modes,
    run_ncu,
)
from characterize.measure.worker import (
    BENCH_CLOCK_CONTROL,
    EXIT_CUDA_ERROR,
    HEARTBEAT,
    INFLIGHT,
    PROFILE_RANGE,
    PROFILED,
    kernel_filter,
    launches_before_profiled,
    profiled_launches,
)
from characterize.progress import Progress
from characterize.progress import quiet as _quiet
from characterize.store import (
    RunDir,
    RunLock,
    fingerprint_differences,
    load_run,
    point_fingerprint,
    point_key,
    read_json,
)


def pending_points(run: RunDir, kind: str, exp: ExperimentConfig, variants: Sequence[str] | None = None,
                   datasets: Sequence[str] | None = None, say: Progress | None = None) -> list[tuple[str, str]]:
    """(variant, dataset) points of the experiment not finished yet, dataset-major. A point
    file that exists but is not a point (damaged, cut short, a list where a record belongs) is
    measured again, said to `say` and in the run's log naming the file and what is wrong."""
    vs = list(variants or exp.variants)
    ds = list(datasets or exp.datasets)
    out = []
    for d in ds:
        for v in vs:
            if run.has_point(kind, v, d):
                continue
            out.append((v, d))
            path = run.point_path(kind, v, d)
            if path.is_file():
                try:
                    read_json(path, kind)
                except RunDirError as e:
                    msg = f"{kind} {v} {d}: {str(e).split('; ')[0]}; measured again"
                    run.log(msg)
                    if say is not None:
                        say(msg)
    return out


def _worker_cmd(run_dir: Path, points: list[tuple[str, str]], backend: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "characterize.measure.worker", "bench", str(run_dir), "--supervisor", str(os.getpid())]
    for v, d in points:
        cmd += ["--point", f"{v}:{d}"]
    if backend:
        cmd += ["--backend", backend]
    return cmd


def _start_worker(run: RunDir, cmd: list[str]) -> subprocess.Popen:
    """A bench worker tied to this process: it watches the stdin pipe we hold (and never
    write), has the parent-death signal armed, and inherits the run directory's lock so
    no second writer can start while it lives, even if it outlived us."""
    lock_fd = run.lock.fd if run.lock is not None else None
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stdin=subprocess.PIPE,
                            pass_fds=(lock_fd,) if lock_fd is not None else ())


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


#: seconds between two looks at a bench worker (has it exited, has it moved on to another point)
POLL_S = 0.25


#: a bench worker whose heartbeat (worker.start_heartbeat) is older than this is stopped
STALL_S = 30.0


#: why a worker was stopped when the budget's deadline came (its point is left to --resume, not failed)
OUT_OF_TIME = "the time budget ran out"


def _wait_worker(proc: subprocess.Popen, run: RunDir, remaining: list[tuple[str, str]], inflight: Path,
                 timeout_s: float, heartbeat: Path | None = None, stall_s: float = STALL_S,
                 deadline: float | None = None) -> tuple[int, str | None, str]:
    """Wait for a bench worker; (exit code, None, ""), or when it went `timeout_s` without
    finishing the point it is on (or, before its first, without starting one), or its
    heartbeat stopped for `stall_s` (a stopped or frozen process), or the `deadline`
    (time.monotonic) came, stop it and return (its exit code, the key of that point or ""
    when none had started, why it was stopped)."""
    current, since = None, time.monotonic()
    finished = 0
    while True:
        try:
            return proc.wait(timeout=POLL_S), None, ""
        except subprocess.TimeoutExpired:
            pass
        key = inflight.read_text().strip() if inflight.is_file() else None
        done = sum(run.point_path("bench", v, d).is_file() for v, d in remaining)
        if key != current or done != finished:
            current, finished, since = key, done, time.monotonic()
        why = ""
        try:
            silent = time.time() - heartbeat.stat().st_mtime if heartbeat is not None else 0.0
        except OSError:
            silent = 0.0
        if deadline is not None and time.monotonic() > deadline:
            why = OUT_OF_TIME
        elif silent > stall_s:
            why = (f"the worker stopped: no heartbeat for {silent:.0f} s (a stopped or frozen process), well "
                   f"before the point's {timeout_s:g} s timeout")
        elif time.monotonic() - since > timeout_s:
            why = (f"stopped after {timeout_s:g} s without finishing this point (bench.timeout_s, --timeout); "
                   "the worker made no progress")
        if why:
            if silent > stall_s:
                proc.kill()        # a stopped process does not run its SIGTERM handler
            else:
                proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return proc.returncode, key or "", why


def bench_points(run: RunDir, points: list[tuple[str, str]], backend: str | None = None,
                 progress: Progress = _quiet, max_restarts: int = 20, timeout_s: float = 900.0,
                 stall_s: float = STALL_S, deadline: float | None = None) -> dict[str, int]:
    """Time `points` in worker processes; returns counts of ok / failed / cut points. A
    worker that dies costs the point it was on; one that spends `timeout_s` on a point
    without finishing it, or whose heartbeat stops for `stall_s`, is stopped, the point
    recorded as failed, and a fresh worker goes on. At the `deadline` (time.monotonic) the
    worker is stopped and the points not finished are cut: left for --resume, not failed."""
    remaining = list(points)
    restarts, why = 0, ""
    inflight = run.path / "points" / "bench" / INFLIGHT
    heartbeat = run.path / "points" / "bench" / HEARTBEAT
    while remaining:
        inflight.unlink(missing_ok=True)
        heartbeat.unlink(missing_ok=True)
        proc = _start_worker(run, _worker_cmd(run.path, remaining, backend))
        try:
            code, stuck, why = _wait_worker(proc, run, remaining, inflight, timeout_s, heartbeat, stall_s, deadline)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP turned into it by the CLI
            proc.terminate()  # SIGTERM: the worker unwinds (SIGINT may be ignored in background jobs)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            run.log("bench interrupted; finished points are kept (resume with --resume)")
            raise
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
        finished = {(v, d) for v, d in remaining if run.point_path("bench", v, d).is_file()}
        remaining = [p for p in remaining if p not in finished]
        if why == OUT_OF_TIME:
            run.log(f"bench: {OUT_OF_TIME}; {len(remaining)} point(s) left for --resume")
            progress(f"bench: {OUT_OF_TIME}; {len(remaining)} point(s) left for --resume")
            break
        if stuck is not None:
            if not remaining:
                break
            # the point it was on, or (stuck before its first: loading the data) the next one
            v, d = next((p for p in remaining if point_key(*p) == stuck), remaining[0])
            why = f"{why}; see {run.path / 'log.txt'}"
            run.write_point("bench", v, d, {"status": "failed", "error": why})
            run.log(f"bench {v} {d}: {why}")
            progress(f"{v} {d}: {why.split(';')[0]}; continuing with a fresh worker")
            remaining.remove((v, d))
            restarts += 1
            if restarts > max_restarts:
                raise RunDirError(f"bench workers were stopped or died {restarts} times; giving up "
                                  f"(see {run.path / 'log.txt'})")
            continue
        if code == 0 or not remaining:
            break
        # the worker died: blame the point it was working on, continue with a fresh one
        reason = _describe_exit(code)
        blamed = inflight.read_text().strip() if inflight.is_file() else None
        if blamed is None and not finished and code != EXIT_CUDA_ERROR:
            raise RunDirError(f"the bench worker failed before timing any point ({reason}); see the messages above")
        for v, d in list(remaining):
            if point_key(v, d) == blamed:
                run.write_point("bench", v, d, {"status": "failed",
                                                "error": f"worker process died while timing this point ({reason}); "
                                                         f"see {run.path / 'log.txt'}"})
                run.log(f"bench {v} {d}: worker died ({reason})")
                progress(f"{v} {d}: worker died ({reason}); continuing with a fresh worker")
                remaining.remove((v, d))
                break
        restarts += 1
        if restarts > max_restarts:
            raise RunDirError(f"bench workers died {restarts} times; giving up (see {run.path / 'log.txt'})")
    inflight.unlink(missing_ok=True)
    heartbeat.unlink(missing_ok=True)
    pts = load_run(run.path).points("bench")
    keys = {point_key(v, d) for v, d in points}
    ok = sum(p.get("status") == "ok" for p in pts if point_key(p["variant"], p["dataset"]) in keys)
    if why == OUT_OF_TIME:   # the points not written were cut, not failed
        failed = sum(p.get("status") == "failed" for p in pts if point_key(p["variant"], p["dataset"]) in keys)
        return {"ok": ok, "failed": failed, "cut": len(keys) - ok - failed}
    return {"ok": ok, "failed": len(keys) - ok}   # a point not written is not measured either


def points_failed(run: RunDir, kind: str, counts: dict[str, int]) -> PointsFailed | None:
    """The error a bench or profile whose points did not all finish ends with (after it
    printed what it measured), naming the first failure; None when every point finished."""
    if not counts.get("failed"):
        return None
    total = counts["failed"] + counts.get("ok", 0)
    failures = load_run(run.path).failures
    first = ""
    if not failures.empty:
        row = failures.iloc[0]
        first = f" (first: {row.get('variant', '?')} {row.get('dataset', '?')}: " \
                f"{str(row.get('error', '')).splitlines()[0] if row.get('error') else 'no reason recorded'})"
    every = "every one of the " if counts["failed"] == total else ""
    return PointsFailed(f"{every}{counts['failed']} of {total} {kind} point(s) failed{first}; what finished is in "
                        f"{run.path}, and --resume measures the failed points again")


@dataclass(frozen=True)
class ProfileSettings:
    """Where ncu is and how each point is profiled (the rest comes from the experiment)."""

    ncu: Path
    timeout_s: float = 900.0
    backend: str | None = None  # worker backend; None: cuda when a GPU is visible
    deadline: float | None = None  # time.monotonic() after which no ncu runs (a budget): the rest is cut

    def timeout(self, points: int = 1) -> float:
        """Seconds an ncu process for `points` points may take: its timeout, within the deadline."""
        t = self.timeout_s * max(1, points)
        return t if self.deadline is None else max(1.0, min(t, self.deadline - time.monotonic()))

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def ncu_options(exp: ExperimentConfig, sm: int | None, fallback: bool = False):
    """NcuOptions for one point: our kernels inside the chz-profile NVTX range. The
    fallback scopes by launch order instead (skip the warm-up launches), for ncu
    versions whose NVTX filtering does not match nested ranges."""
    prof = exp.profile
    return NcuOptions(metric_set=prof.metric_set, cache_control=prof.cache_control, clock_control=prof.clock_control,
                      replay_mode=prof.replay_mode, nvtx_include=() if fallback else (f"{PROFILE_RANGE}/",),
                      kernel_name=kernel_filter(exp), sm=sm)


_PASSES = re.compile(r"- (\d+) pass(?:es)?\b")


def passes_in(output: str) -> list[int]:
    """Replay passes of each kernel ncu profiled under kernel replay, from its output
    ('==PROF== Profiling "k": 0%....100% - 18 passes')."""
    return [int(n) for n in _PASSES.findall(output)]


def _collect_cache(argv: list[str], run: RunDir, name: str, settings: ProfileSettings) -> dict[str, object]:
    """The cache counters (measure.ncu.CACHE_METRICS) of the points `argv` profiled, in a
    collection that replay does not warm: first under kernel replay, which is the program's
    own cache state when every kernel needs one pass (nothing is replayed); when ncu needed
    more, again under application replay (the program runs once per pass). A failure keeps
    the main report: its kernel-replay values stand, recorded as such."""
    export = export_path(run.path / "ncu" / f"{name}.cache")
    log = run.path / "ncu" / f"{name}.cache.log"
    for mode in (CACHE_SINGLE_PASS_MODE, CACHE_REPLAY_MODE):
        cmd = cache_argv(argv, export, replay_mode="kernel" if mode == CACHE_SINGLE_PASS_MODE else CACHE_REPLAY_MODE)
        try:
            proc = run_ncu(cmd, log, timeout=settings.timeout(argv.count("--point")))
        except NcuPermissionError:
            raise
        except CharacterizeError as e:
            run.log(f"profile {name}: cache collection failed, kernel-replay cache counters kept: {e}")
            return {"cache_argv": cmd, "cache_error": str(e)}
        passes = passes_in(proc.stdout)
        if mode == CACHE_REPLAY_MODE or (passes and max(passes) == 1):
            break
        run.log(f"profile {name}: the cache counters took {max(passes, default=0)} kernel-replay passes (later "
                "passes see a warmed L2); collecting them again under application replay")
    return {"cache_argv": cmd, "cache_report": str(export.relative_to(run.path)), "cache_replay_mode": mode}


def _target(run: RunDir, points: Sequence[tuple[str, str]], settings: ProfileSettings) -> list[str]:
    """The profile target for `points`, in order, in one process (worker.run_profile_target)."""
    cmd = [sys.executable, "-m", "characterize.measure.worker", "profile", str(run.path)]
    for v, d in points:
        cmd += ["--point", f"{v}:{d}"]
    return cmd + (["--backend", settings.backend] if settings.backend else [])


def _ncu_said(e: CharacterizeError) -> str:
    """ncu's own error lines in a failure, without the paths that differ per point."""
    return "\n".join(ln for ln in getattr(e, "output", "").splitlines() if ln.lstrip().startswith("==ERROR=="))


def _worker_said(e: CharacterizeError, log: Path) -> CharacterizeError:
    """The worker's own one-line reason (a failed correctness check, a bad trace) says more than ncu's."""
    said = [ln[len("error: "):] for ln in getattr(e, "output", "").splitlines() if ln.startswith("error: ")]
    return type(e)(said[-1] + f" (under ncu; full log: {log})") if said else e


def _point_record(exp: ExperimentConfig, export: Path, run: RunDir, n: int, argv: list[str], version: str,
                  scoping: str, cache: dict, sm: int | None, seconds: float, variant: str, **extra: object) -> dict:
    return {"status": "ok", "report": str(export.relative_to(run.path)), "kernels": n, "argv": argv,
            "ncu_version": version, "cache_control": exp.profile.cache_control,
            "clock_control": exp.profile.clock_control, "bench_clock_control": BENCH_CLOCK_CONTROL,
            "replay_mode": exp.profile.replay_mode, "metric_set": exp.profile.metric_set, "scoping": scoping,
            "warmup_batches": exp.bench.warmup, **cache,
            "tables_per_launch": exp.workload.T if get_variant(variant).batched else 1,
            "replay_modes": replay_modes(ncu_options(exp, sm), cache_collected="cache_report" in cache,
                                         cache_mode=str(cache.get("cache_replay_mode", CACHE_REPLAY_MODE))),
            "seconds": seconds, **extra}


class _Follow:
    """What the profile target prints, line by line (run_ncu's echo): each finished point as
    one progress line, while the one ncu process runs."""

    def __init__(self, points: Sequence[tuple[str, str]], progress: Progress, done: int, total: int):
        self.left = list(points)
        self.progress, self.done, self.total = progress, done, total
        self.start = time.perf_counter()

    def write(self, line: str) -> None:
        if not line.startswith(PROFILED + " "):
            return
        words = line.split()
        if len(words) >= 3 and (words[1], words[2].rstrip(":")) in self.left:
            self.left.remove((words[1], words[2].rstrip(":")))
            self.done += 1
            self.progress(f"[{self.done}/{self.total}] {words[1]} {words[2].rstrip(':')}: launched under ncu "
                          f"({time.perf_counter() - self.start:.0f} s into the shared process)")


def _next_name(run: RunDir, stem: str) -> str:
    """A report name not used yet in the run's ncu/ (a resumed profile keeps the earlier reports)."""
    n = 1
    while (run.path / "ncu" / f"{stem}-{n}.ncu-rep").exists() or (run.path / "ncu" / f"{stem}-{n}.log").exists():
        n += 1
    return f"{stem}-{n}"


def _profile_together(run: RunDir, exp: ExperimentConfig, points: list[tuple[str, str]], settings: ProfileSettings,
                      sm: int | None, version: str, progress: Progress, done: int, total: int
                      ) -> dict[tuple[str, str], int]:
    """Every point under one ncu process (the target loads each dataset once and profiles
    its points in turn, each in its own chz/<variant>/<dataset>/<table> NVTX ranges), then
    the cache counters of all of them in one more collection. Returns each attributed point's
    kernel count; points the report does not hold as expected are left to be profiled one by
    one (an empty dict when the process failed)."""
    name = _next_name(run, "profile")
    export = export_path(run.path / "ncu" / name)
    log = run.path / "ncu" / f"{name}.log"
    argv = build_argv(settings.ncu, ncu_options(exp, sm), export, _target(run, points, settings))
    start = time.perf_counter()
    try:
        run_ncu(argv, log, timeout=settings.timeout(len(points)), echo=_Follow(points, progress, done, total))
        kernels = read_report(export, run=run.path.name)
    except NcuPermissionError:
        raise
    except CharacterizeError as e:
        if settings.out_of_time():
            run.log(f"profile: {OUT_OF_TIME} during the shared ncu process; its points are left for --resume")
            return {}
        run.log(f"profile: one process for {len(points)} points did not work ({str(e).splitlines()[0]}); "
                "profiling them one by one")
        return {}
    launches = [profiled_launches(v, exp.profile.tables, exp.workload.T) for v, _ in points]
    positions = split_points(kernels, points, launches)
    if positions is None:
        run.log(f"profile: the shared report does not hold each point's launches in order "
                f"({len(set(kernels['kernel_id'])) if not kernels.empty else 0} kernels for {sum(launches)} "
                "expected); profiling the points one by one")
        return {}
    cache = _collect_cache(argv, run, name, settings)
    seconds = time.perf_counter() - start
    keys = [point_key(v, d) for v, d in points]
    for (v, d), where in positions.items():
        run.write_point("profile", v, d, _point_record(
            exp, export, run, len(where), argv, version, "nvtx", cache, sm, seconds / len(points), v,
            report_shared_by=keys, report_positions=where))
    return {p: len(where) for p, where in positions.items()}


@dataclass(frozen=True)
class ProfileCosts:
    """Seconds the parts of a profile take, read from the H200's logs (profiles/h200: the
    first run's profile logs, 32-39 s per variant for four program runs of one point, and
    ncu-probe/summary.txt, 6.3 s for one kernel's one pass, 0.04-0.08 s per further pass)."""

    start_s: float = 6.0            # ncu, then the target's python, torch and CUDA context
    lookups_per_s: float = 7e6      # a dataset's trace generated and copied to the device (paper: 29.5M, ~4 s)
    point_s: float = 0.6            # a point's bind, correctness check and warm-up batches
    pass_s: float = 0.06            # one replay pass of one kernel
    passes: dict[str, int] = field(default_factory=lambda: {"default": 36, "quick": 4, "cache": 1})


@dataclass(frozen=True)
class ProfileEstimate:
    """What a profile of some points will cost, said before it starts."""

    program_s: float     # one run of the target: start, datasets, points
    kernels: int         # kernels profiled
    passes: int          # replay passes per kernel of the main collection
    main_s: float
    cache_s: float

    @property
    def seconds(self) -> float:
        return self.main_s + self.cache_s

    def describe(self) -> str:
        return (f"the target {self.program_s:.0f} s, {self.kernels} kernel(s) x {self.passes} passes "
                f"{self.main_s - self.program_s:.0f} s, cache counters {self.cache_s:.0f} s")


def profile_estimate(exp: ExperimentConfig, points: Sequence[tuple[str, str]],
                     costs: ProfileCosts = ProfileCosts()) -> ProfileEstimate:
    """Seconds profiling `points` in one ncu process (and their cache counters in one more,
    one pass per kernel) should take, from `costs`."""
    wl = exp.workload
    datasets = len({d for _, d in points})
    lookups = wl.T * wl.batches * wl.lookups_per_batch
    program = costs.start_s + datasets * lookups / costs.lookups_per_s + len(points) * costs.point_s
    kernels = sum(profiled_launches(v, exp.profile.tables, wl.T) for v, _ in points)
    passes = costs.passes.get(exp.profile.metric_set, costs.passes["default"])
    main = program + kernels * passes * costs.pass_s
    cache = program + kernels * costs.passes["cache"] * costs.pass_s
    return ProfileEstimate(program, kernels, passes, main, cache)


def split_points(kernels, points: Sequence[tuple[str, str]], launches: Sequence[int]
                 ) -> dict[tuple[str, str], list[int]] | None:
    """Which kernels of a report shared by several points belong to each, as launch-order
    positions: the target profiles the points in order, `launches[i]` launches for point i.
    Where NVTX named a kernel's variant or dataset it must agree. None when the report does
    not hold exactly that."""
    if kernels.empty:
        return None
    order = list(dict.fromkeys(kernels["kernel_id"]))
    if len(order) != sum(launches):
        return None
    first = kernels.drop_duplicates("kernel_id").set_index("kernel_id")
    out: dict[tuple[str, str], list[int]] = {}
    at = 0
    for (v, d), n in zip(points, launches):
        out[(v, d)] = list(range(at, at + n))
        at += n
        for column, want in (("variant", v), ("dataset", d)):
            if column not in first.columns:
                continue
            said = {str(first[column][order[p]]) for p in out[(v, d)]} - {"", "nan", "None", "<NA>"}
            if said and said != {want}:
                return None
    return out


def _profile_point(run: RunDir, exp: ExperimentConfig, v: str, d: str, settings: ProfileSettings,
                   sm: int | None, version: str) -> int:
    """One point in its own ncu process: NVTX scoping, or the launch order when NVTX
    matched nothing. Returns the kernels profiled; raises what failed."""
    key = point_key(v, d)
    export = export_path(run.path / "ncu" / key)
    target = _target(run, [(v, d)], settings)
    start = time.perf_counter()
    argv = build_argv(settings.ncu, ncu_options(exp, sm), export, target)
    try:
        return _run_point(run, exp, v, d, settings, sm, version, key, export, target, argv, start)
    except CharacterizeError as e:
        e.argv = getattr(e, "argv", None) or argv  # type: ignore[attr-defined]
        raise


def _run_point(run: RunDir, exp: ExperimentConfig, v: str, d: str, settings: ProfileSettings, sm: int | None,
               version: str, key: str, export: Path, target: list[str], argv: list[str], start: float) -> int:
    scoping, extra = "nvtx", {}
    try:
        run_ncu(argv, run.path / "ncu" / f"{key}.log", timeout=settings.timeout())
    except NcuError as e:
        if getattr(e, "reason", "") != "no_kernels":
            raise
        # NVTX scoping matched nothing: scope by launch order instead, skipping every launch
        # the kernel filter matches before the profiled ones (the check's reference included)
        skip = launches_before_profiled(v, exp.workload.T, exp.bench.warmup)
        count = profiled_launches(v, exp.profile.tables, exp.workload.T)
        argv = build_argv(settings.ncu, ncu_options(exp, sm, fallback=True), export, target)
        i_k = argv.index("-k")
        argv[i_k:i_k] = ["--launch-skip", str(skip), "--launch-count", str(count)]
        scoping, extra = "launch-skip", {"launch_skip": skip, "launch_count": count}
        try:
            run_ncu(argv, run.path / "ncu" / f"{key}.log", timeout=settings.timeout())
        except CharacterizeError as again:
            again.argv = argv  # type: ignore[attr-defined]
            raise
    kernels = read_report(export, run=run.path.name)
    cache = _collect_cache(argv, run, key, settings)
    n = int(kernels["kernel_id"].nunique()) if not kernels.empty else 0
    run.write_point("profile", v, d, _point_record(exp, export, run, n, argv, version, scoping, cache, sm,
                                                   time.perf_counter() - start, v, **extra))
    return n


def profile_points(run: RunDir, exp: ExperimentConfig, points: list[tuple[str, str]], settings: ProfileSettings,
                   progress: Progress = _quiet) -> dict[str, int]:
    """Every point in one ncu process where NVTX scoping allows (one report, one cache
    collection, one start of ncu and of the target, each dataset's trace loaded once),
    dataset-major; the points that one could not attribute, one ncu process each. A
    permission error stops the profile (nothing else can succeed); any other failure marks
    its point and moves on."""
    version = ncu_version(settings.ncu)
    run.update_meta(ncu={"path": str(settings.ncu), "version": version})
    found = devices()
    sm = int(found[0].arch.removeprefix("sm_")) if found else None
    counts = {"ok": 0, "failed": 0}
    order = {d: i for i, d in enumerate(dict.fromkeys(d for _, d in points))}
    points = sorted(points, key=lambda p: order[p[1]])   # dataset-major: each trace loaded once
    estimate = profile_estimate(exp, points)
    progress(f"profile: {len(points)} point(s), {estimate.kernels} kernel(s) under one ncu process, then their "
             f"cache counters in one more; about {estimate.seconds:.0f} s ({estimate.describe()})")
    run.log(f"profile estimate: {estimate.seconds:.0f} s for {len(points)} point(s) ({estimate.describe()})")
    done = 0
    shared: dict[tuple[str, str], int] = {}
    if len(points) > 1:
        start = time.perf_counter()
        shared = _profile_together(run, exp, points, settings, sm, version, progress, 0, len(points))
        for v, d in points:
            if (v, d) in shared:
                done += 1
                counts["ok"] += 1
                run.log(f"profile [{done}/{len(points)}] {v} {d}: {shared[(v, d)]} kernel(s) profiled "
                        f"({len(points)} points in one ncu process)")
        if shared:
            progress(f"profile: {len(shared)} point(s) in one ncu process, {time.perf_counter() - start:.0f} s "
                     f"(estimated {estimate.seconds:.0f} s)")
    repeated, last_said, stop = 0, "", ""
    for v, d in points:
        if (v, d) in shared:
            continue
        if stop:
            counts["failed"] += 1
            done += 1
            run.write_point("profile", v, d, {"status": "failed", "error": f"not profiled: ncu failed the same way "
                                                                         f"for the points before ({stop})"})
            continue
        if settings.out_of_time():
            counts["cut"] = counts.get("cut", 0) + 1
            continue
        done += 1
        key = point_key(v, d)
        start = time.perf_counter()
        try:
            n = _profile_point(run, exp, v, d, settings, sm, version)
        except NcuPermissionError as e:
            run.write_point("profile", v, d, {"status": "failed", "error": str(e)})
            run.log(f"profile stopped: {e}")
            raise
        except CharacterizeError as e:
            counts["failed"] += 1
            argv = getattr(e, "argv", None)   # the worker's own line replaces the error, not the command
            reason, said = getattr(e, "reason", ""), _ncu_said(e)
            e = _worker_said(e, run.path / "ncu" / (key + ".log"))
            run.write_point("profile", v, d, {"status": "failed", "error": str(e),
                                              **({"argv": argv} if argv is not None else {})})
            run.log(f"profile {v} {d}: failed: {e}")
            progress(f"[{done}/{len(points)}] {v} {d}: FAILED: {str(e).splitlines()[0]}")
            if reason == "ncu_failed" and said:
                repeated = repeated + 1 if said == last_said else 1
                last_said = said
                if repeated >= 2:   # ncu itself refuses the collection (a metric, an option): no point goes
                    stop = str(e)
            continue
        counts["ok"] += 1
        msg = f"[{done}/{len(points)}] {v} {d}: {n} kernel(s) profiled in {time.perf_counter() - start:.0f} s"
        run.log(f"profile {msg}")
        progress(msg)
    if counts.get("cut"):
        run.log(f"profile: {OUT_OF_TIME}; {counts['cut']} point(s) left for --resume")
        progress(f"profile: {OUT_OF_TIME}; {counts['cut']} point(s) left for --resume")
    return counts


def open_run(path: Path, exp: ExperimentConfig, meta: dict, stage: str, resume: bool,
             remeasure: bool = False) -> RunDir:
    """Open a run directory for a stage. Its writer lock is taken first (RunDirLocked
    while another process writes it); a directory holding another experiment is
    refused; a stage with finished points needs --resume (or another --out). Finished
    points measured with anything else than `meta`'s fingerprint says (parameters,
    settings, a trace file's contents, the toolkit, the GPU), or that no meta.json
    vouches for, are never reused: the resume is refused naming the difference, or with
    `remeasure` those points are measured again and the others kept."""
    lock = RunLock.acquire(path)  # noqa: F841 - held until create() takes the same lock for the RunDir it returns
    fp = meta.get("fingerprint")
    if (path / "meta.json").exists():
        existing = load_run(path)
        old = existing.meta["experiment"]
        if old.get("name") != exp.name:
            raise RunDirError(f"{path} holds a run of a different experiment ({old.get('name')}); choose another "
                              "--out")
        if existing.points(stage) and not resume:
            raise RunDirError(f"{path} already has {len(existing.points(stage))} {stage} point(s); pass --resume "
                              "to continue (finished points are kept) or choose another --out")
        stale = _stale_points(path, fp)
        if stale and not remeasure:
            raise RunDirError(_stale_message(path, stale))
        return RunDir.create(path, meta, resume=True)
    orphans = [f for kind in ("bench", "profile") for f in sorted(path.glob(f"points/{kind}/*.json"))
               if _finished(f, kind)]
    if orphans and not remeasure:
        raise RunDirError(f"{path} holds {len(orphans)} measured point(s) but no meta.json, so nothing says what "
                          "they measured and they cannot be reused; pass --remeasure to measure them again, or "
                          "choose another --out")
    for f in orphans:   # asked for: measured again from scratch
        f.unlink(missing_ok=True)
    return RunDir.create(path, meta, resume=False)


def _finished(path: Path, kind: str) -> bool:
    try:
        return read_json(path, kind).get("status") == "ok"
    except RunDirError:
        return False


def _stale_points(path: Path, fp: dict | None) -> list[tuple[str, str, str, list[str]]]:
    """(kind, variant, dataset, differences) of every finished point whose fingerprint
    differs from the part of `fp` it depends on."""
    if not fp:
        return []
    out = []
    for kind in ("bench", "profile"):
        for f in sorted(path.glob(f"points/{kind}/*.json")):
            try:
                pt = read_json(f, kind)
            except RunDirError:
                continue   # damaged: never reused, measured again
            if pt.get("status") != "ok":
                continue
            want = point_fingerprint(fp, kind, pt["variant"], pt["dataset"])
            if pt.get("fingerprint") != want:
                diffs = fingerprint_differences(pt.get("fingerprint"), want, pt["variant"], kind)
                out.append((kind, pt["variant"], pt["dataset"], diffs))
    return out


def _stale_message(path: Path, stale: list[tuple[str, str, str, list[str]]]) -> str:
    diffs = list(dict.fromkeys(d for *_, ds in stale for d in ds))
    shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
    kinds = ", ".join(f"{sum(k == kind for k, *_ in stale)} {kind}" for kind in ("bench", "profile")
                      if any(k == kind for k, *_ in stale))
    return (f"{path} holds {len(stale)} finished point(s) ({kinds}) measured with something else than now: {shown}; "
            "resuming would mix them with new ones. Pass --remeasure to measure those points again (the others are "
            "kept), or choose another --out")
