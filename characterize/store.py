"""Store stage: self-describing run directories that survive interruptions.

A run directory holds everything needed to analyze a run later, on any machine; the
files it can hold are declared once in characterize.rundir (path, format, the step
that writes it, columns with units), and `RunDir.write` / `Run.table` read and write
them through that declaration.

Each point file is complete or absent (written to a temporary name, then renamed), so
a killed process leaves a valid partial run and `--resume` skips what is finished.
`load_run()` turns a directory back into DataFrames for notebooks and reports.

One process writes a run directory at a time: `RunDir.create` takes an exclusive
`flock` on `.lock` that lives as long as the writer (the kernel drops it when the
process dies, so it is never stale; bench workers inherit it). A second writer gets
RunDirLocked naming the holder instead of measuring the same points beside it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from characterize.errors import CharacterizeError, RunDirError, RunDirLocked
from characterize.extract.ncu_rep import read_report
from characterize.extract.read import wide
from characterize.rundir import artifact

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locking
    fcntl = None  # type: ignore[assignment]

META = artifact("meta").path
LOG = artifact("log").path
LOCK = artifact("lock").path
#: seconds a second writer waits for a run directory's lock (a killed writer's workers need a moment to exit)
LOCK_WAIT_S = 5.0


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file so that readers see the old content or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; run directories are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def conform(key: str, df: pd.DataFrame) -> pd.DataFrame:
    """`df` with the declared columns of table artifact `key`, in their order: a missing
    one is added empty; an undeclared one is a ValueError (declare it in rundir first)."""
    names = artifact(key).column_names
    extra = [c for c in df.columns if c not in names]
    if extra:
        raise ValueError(f"{artifact(key).path}: columns {', '.join(map(str, extra))} are not declared in "
                         "characterize.rundir")
    return df.reindex(columns=names)


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=False, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def point_key(variant: str, dataset: str) -> str:
    """File-system safe name of a (variant, dataset) point."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", dataset)
    return f"{variant}__{safe}"


def git_revision() -> str | None:
    """The source tree's commit (with '+dirty' when modified), if it is a git checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    """Software identity of this machine (the GPU part is added by the runner)."""
    import numpy
    import torch

    return {"hostname": platform.node(), "platform": platform.platform(), "python": sys.version.split()[0],
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "numpy": numpy.__version__,
            "pandas": pd.__version__, "git_revision": git_revision()}


class RunLock:
    """The exclusive writer lock of one run directory (flock on `.lock`).

    Within a process it is shared: every RunDir of the same directory holds the same
    lock, released when the last of them is gone (or on `release()`). Its file
    descriptor is what a worker process inherits (`fd`) to keep the lock while it lives.
    """

    _held: "weakref.WeakValueDictionary[Path, RunLock]" = weakref.WeakValueDictionary()

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def acquire(cls, run_dir: str | Path, wait_s: float | None = None) -> "RunLock":
        """Take the lock of `run_dir` (created if missing), waiting up to `wait_s` (LOCK_WAIT_S)
        for a writer that is just exiting; RunDirLocked names a holder that stays."""
        p = Path(run_dir)
        p.mkdir(parents=True, exist_ok=True)
        key = p.resolve()
        held = cls._held.get(key)
        if held is not None and held.fd is not None:
            return held
        if fcntl is None:  # pragma: no cover
            lock = cls(key, None)
            cls._held[key] = lock
            return lock
        fd = os.open(p / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + (LOCK_WAIT_S if wait_s is None else wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                holder = _lock_holder(p / LOCK)
                os.close(fd)
                pid = f" (`kill {holder['pid']}`)" if holder.get("pid") else ""
                who = f"pid {holder.get('pid', '?')}: {holder.get('command', '?')}, since {holder.get('since', '?')}"
                raise RunDirLocked(f"{p} is being written by another process ({who}); wait for it to finish or "
                                   f"stop it{pid}, or choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "command": shlex.join(sys.argv), "since": _now()}).encode())
        lock = cls(key, fd)
        cls._held[key] = lock
        return lock

    def release(self) -> None:
        """Give the lock up (also done when the last RunDir holding it is collected)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            if self._held.get(self.path) is self:
                del self._held[self.path]
            os.close(fd)  # closing the last descriptor of the open file releases the flock

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit the kernel releases it anyway
            pass


_TEMPORARY = re.compile(r"^\..+\.(json|csv|html|txt|parquet)\.[a-z0-9_]{8}$")


def _remove_temporaries(run_dir: Path) -> None:
    """Half-written files (write_atomic's temporaries) of a writer that was killed; only
    called under the directory's lock, when no other writer can be alive."""
    for d in (run_dir, *run_dir.glob("points/*")):
        for f in d.glob(".*"):
            if _TEMPORARY.match(f.name) and f.is_file():
                f.unlink(missing_ok=True)


def _lock_holder(path: Path) -> dict[str, Any]:
    try:
        info = json.loads(path.read_text() or "{}")
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


@dataclass
class RunDir:
    """A run directory being written (holding its writer lock when opened by `create`)."""

    path: Path
    lock: RunLock | None = field(default=None, repr=False, compare=False)

    @classmethod
    def create(cls, path: str | Path, meta: dict[str, Any], resume: bool = False) -> "RunDir":
        """Open `path` for writing. An existing run is continued only with resume=True
        (its finished points are kept); a new one gets meta.json at once. Takes the
        directory's writer lock first: RunDirLocked while another process writes it."""
        p = Path(path)
        lock = RunLock.acquire(p)
        _remove_temporaries(p)
        if (p / META).is_file() and not resume:
            existing = json.loads((p / META).read_text())
            raise RunDirError(f"{p} already holds a run ({existing.get('experiment', {}).get('name', '?')}, "
                              f"started {existing.get('started', '?')}); pass --resume to continue it or "
                              "--out to choose another directory")
        p.mkdir(parents=True, exist_ok=True)
        run = cls(p, lock)
        if (p / META).is_file():
            old = json.loads((p / META).read_text())
            old.setdefault("resumed", []).append(_now())
            old["command_line"] = meta.get("command_line", old.get("command_line"))
            for key, value in meta.items():
                old.setdefault(key, value)
            write_json(p / META, old)
        else:
            write_json(p / META, {"started": _now(), **meta})
        return run

    def release(self) -> None:
        """Stop writing: give the directory's lock up for other processes."""
        if self.lock is not None:
            self.lock.release()

    # ---------------------------------------------------------------- writing
    def update_meta(self, **changes: Any) -> None:
        meta = json.loads((self.path / META).read_text())
        meta.update(changes)
        write_json(self.path / META, meta)

    def log(self, message: str) -> None:
        with open(self.path / LOG, "a") as f:
            f.write(f"{_now()} {message}\n")

    def point_path(self, kind: str, variant: str, dataset: str) -> Path:
        return self.path / artifact(kind).path.replace("*", point_key(variant, dataset))

    def has_point(self, kind: str, variant: str, dataset: str) -> bool:
        """True when the point finished (a failed point is retried on resume)."""
        p = self.point_path(kind, variant, dataset)
        if not p.is_file():
            return False
        try:
            return json.loads(p.read_text()).get("status") == "ok"
        except ValueError:
            return False

    def write_point(self, kind: str, variant: str, dataset: str, record: dict[str, Any]) -> Path:
        p = self.point_path(kind, variant, dataset)
        write_json(p, {"kind": kind, "variant": variant, "dataset": dataset, "finished": _now(), **record})
        return p

    def annotate_point(self, kind: str, variant: str, dataset: str, **fields: Any) -> bool:
        """Add `fields` to a finished point's file (atomically); False when there is none."""
        p = self.point_path(kind, variant, dataset)
        try:
            record = json.loads(p.read_text())
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict):
            return False
        write_json(p, {**record, **fields})
        return True

    def write(self, key: str, data: pd.DataFrame | dict[str, Any]) -> Path:
        """Write the declared artifact `key` (characterize.rundir) atomically: a table in
        its declared column order (a declared column the frame lacks is written empty; one
        it does not declare is a bug and refused), a JSON artifact as it is."""
        a = artifact(key)
        p = self.path / a.path
        if a.format == "csv":
            write_atomic(p, conform(key, data).to_csv(index=False))
        elif a.format == "json":
            write_json(p, data)
        else:
            raise ValueError(f"{a.path} is not written whole ({a.format})")
        return p


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------ reading
@dataclass
class Run:
    """A stored run, exposed as DataFrames (the notebook and report entry point)."""

    path: Path
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.meta.get("name") or self.path.name

    @property
    def gpu(self) -> str | None:
        return (self.meta.get("gpu") or {}).get("name")

    def table(self, key: str) -> pd.DataFrame:
        """A declared table artifact (characterize.rundir) as written; empty when the step
        that writes it has not run."""
        p = self.path / artifact(key).path
        if not p.is_file():
            return pd.DataFrame()
        try:
            return pd.read_csv(p)
        except (ValueError, pd.errors.ParserError) as e:
            raise RunDirError(f"{p}: unreadable ({e})") from None

    def points(self, kind: str) -> list[dict[str, Any]]:
        out = []
        for p in sorted(self.path.glob(artifact(kind).path)):
            try:
                out.append(json.loads(p.read_text()))
            except ValueError:
                continue  # a torn file cannot exist (atomic writes); foreign junk is ignored
        return out

    @cached_property
    def static(self) -> pd.DataFrame:
        """Registers, spills, theoretical occupancy per variant x arch (x cap)."""
        return self.table("static")

    @cached_property
    def sass(self) -> pd.DataFrame:
        """The hot loop of each variant's kernels per arch, read from the SASS: loads by
        width, spills in the loop, latencies per iteration, rows in flight."""
        return self.table("sass")

    @cached_property
    def e2e(self) -> pd.DataFrame:
        """The DLRM step per variant x dataset x GPU x phase x stage (predicted, and
        measured on a GPU): time_us with its band, source, speedups, embedding share."""
        return self.table("e2e")

    @cached_property
    def locality(self) -> pd.DataFrame:
        """One row per dataset: lookups, unique rows, top-K coverage, reuse quantiles."""
        p = self.path / artifact("locality").path
        if not p.is_file():
            return pd.DataFrame()
        rows = []
        for ds, s in json.loads(p.read_text()).items():
            row = {"dataset": ds, **{k: v for k, v in s.items() if not isinstance(v, (dict, list))}}
            for k, v in s.get("top_k_coverage", {}).items():
                row[f"top_{k}_coverage"] = v
            for k, v in s.get("reuse_distance_quantiles", {}).items():
                row[f"reuse_{k}"] = v
            rows.append(row)
        return pd.DataFrame(rows)

    @cached_property
    def locality_raw(self) -> dict[str, Any]:
        p = self.path / artifact("locality").path
        return json.loads(p.read_text()) if p.is_file() else {}

    @cached_property
    def predictions(self) -> pd.DataFrame:
        """Model predictions per variant x dataset x GPU (model stage)."""
        return self.table("predictions")

    @cached_property
    def model_validation(self) -> pd.DataFrame:
        """The model against the paper's A100 claims: claim, paper, model, agrees."""
        return self.table("model_validation")

    @cached_property
    def bench(self) -> pd.DataFrame:
        """One row per finished (variant, dataset, mode) with latency statistics."""
        rows = []
        for pt in self.points("bench"):
            for s in pt.get("summary", []):
                rows.append({"variant": pt["variant"], "dataset": pt["dataset"], "status": pt.get("status"), **s})
        return pd.DataFrame(rows)

    @cached_property
    def timings(self) -> pd.DataFrame:
        """Every timed repetition: variant, dataset, mode, rep, what (kernel/prepass), time_us."""
        frames = []
        for pt in self.points("bench"):
            reps = pt.get("repetitions")
            if reps:
                df = pd.DataFrame(reps)
                df.insert(0, "dataset", pt["dataset"])
                df.insert(0, "variant", pt["variant"])
                frames.append(df)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @cached_property
    def failures(self) -> pd.DataFrame:
        """Failed points, and profiled points whose report cannot be read."""
        rows = [{"kind": k, "variant": p["variant"], "dataset": p["dataset"], "error": p.get("error", "")}
                for k in ("bench", "profile") for p in self.points(k) if p.get("status") != "ok"]
        self.metrics  # noqa: B018 (reading the reports finds the unreadable ones)
        return pd.DataFrame(rows + self.unreadable_reports)

    @cached_property
    def unreadable_reports(self) -> list[dict[str, str]]:
        """Profiled points whose .ncu-rep is missing or damaged (found by `metrics`)."""
        return []

    @cached_property
    def metrics(self) -> pd.DataFrame:
        """Tidy ncu metrics of every profiled point (long format). A missing or damaged
        report costs only its own point; it is listed in `unreadable_reports`."""
        frames = []
        for pt in self.points("profile"):
            if pt.get("status") != "ok" or not pt.get("report"):
                continue
            try:
                df = read_report(self.path / pt["report"], run=self.name, allow_partial=True)
            except CharacterizeError as e:
                self.unreadable_reports.append({"kind": "profile report", "variant": pt["variant"],
                                                "dataset": pt["dataset"], "error": str(e)})
                continue
            positions = pt.get("report_positions")
            if positions is not None:   # one ncu process profiled the variant's points: keep this one's kernels
                df = _at_positions(df, positions)
            # the point knows its variant/dataset even if NVTX names were lost
            df["variant"] = df["variant"].replace("", pd.NA).fillna(pt["variant"])
            df["dataset"] = df["dataset"].replace("", pd.NA).fillna(pt["dataset"])
            df["cache_control"] = pt.get("cache_control", "")
            df["clock_control"] = pt.get("clock_control", "")
            df["replay_mode"] = pt.get("replay_modes", {}).get("default", pt.get("replay_mode", ""))
            if pt.get("cache_report"):
                df = _with_cache_counters(df, self.path / pt["cache_report"], pt.get("replay_modes", {}), self.name,
                                          positions)
            frames.append(df)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """One row per profiled kernel with friendly metric columns (extract.wide)."""
        m = self.metrics
        if m.empty:
            return pd.DataFrame()
        w = wide(m)
        extra = m.groupby(["report", "kernel_id"])[["cache_control", "clock_control"]].first().reset_index()
        return w.merge(extra, on=["report", "kernel_id"], how="left")

    def summary(self) -> dict[str, Any]:
        return {"path": str(self.path), "name": self.name, "gpu": self.gpu,
                "bench_points": len(self.points("bench")), "profile_points": len(self.points("profile")),
                "static_rows": len(self.static), "datasets": list(self.locality_raw)}


def _at_positions(df: pd.DataFrame, positions: list[int]) -> pd.DataFrame:
    """The kernels of a report at these launch-order positions (a point's share of a shared report)."""
    order = list(pd.unique(df["kernel_id"]))
    keep = {order[p] for p in positions if p < len(order)}
    return df[df["kernel_id"].isin(keep)]


def _with_cache_counters(df: pd.DataFrame, path: Path, modes: dict[str, str], run: str,
                         positions: list[int] | None = None) -> pd.DataFrame:
    """A point's metrics with its cache counters taken from the separate collection
    that replay did not warm (measure.ncu.CACHE_METRICS, application replay), kernels
    matched by launch order; `replay_mode` says which collection each value is from.
    An unreadable cache report leaves the kernel-replay values, labelled as such."""
    try:
        cache = read_report(path, run=run, allow_partial=True)
    except CharacterizeError:
        return df
    wanted = {m: mode for m, mode in modes.items() if m != "default"}
    cache = cache[cache["metric"].isin(list(wanted))]
    if positions is not None:   # a report shared by a variant's points: this point's kernels only
        cache = _at_positions(cache, positions)
    if cache.empty or df.empty:
        return df
    ids = list(pd.unique(df["kernel_id"]))
    cache_pos = {k: i for i, k in enumerate(pd.unique(cache["kernel_id"]))}
    cache = cache[cache["kernel_id"].map(cache_pos) < len(ids)].copy()
    cache["kernel_id"] = [ids[cache_pos[k]] for k in cache["kernel_id"]]
    first = df.drop_duplicates("kernel_id").set_index("kernel_id")
    kept = df[~df.set_index(["kernel_id", "metric"]).index.isin(cache.set_index(["kernel_id", "metric"]).index)]
    rows = first.loc[cache["kernel_id"]].reset_index()
    rows["metric"], rows["unit"], rows["value"] = cache["metric"].values, cache["unit"].values, cache["value"].values
    rows["replay_mode"] = [wanted[m] for m in cache["metric"]]
    return pd.concat([kept, rows[df.columns]], ignore_index=True)


def load_run(path: str | Path) -> Run:
    """Open a run directory for analysis."""
    p = Path(path)
    if not p.exists():
        raise RunDirError(f"{p}: no such run directory")
    if p.is_file():
        raise RunDirError(f"{p} is a file; give the run directory (for a report file use `characterize import`)")
    if not (p / META).is_file():
        raise RunDirError(f"{p} is not a run directory (no {META})")
    try:
        meta = json.loads((p / META).read_text())
    except ValueError as e:
        raise RunDirError(f"{p / META}: not valid JSON ({e})") from None
    return Run(p, meta)


def list_runs(root: str | Path) -> list[Path]:
    """Run directories directly under `root`."""
    return sorted(d for d in Path(root).iterdir() if (d / META).is_file()) if Path(root).is_dir() else []
