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

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import shlex
import stat
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from characterize import __version__
from characterize.errors import CharacterizeError, RunDirError, RunDirLocked, escape_text
from characterize.extract.ncu_rep import read_report
from characterize.extract.read import wide
from characterize.files import file_kind, tagged, write_atomic
from characterize.kernels.build import kernels_dir
from characterize.rundir import Artifact, Field, artifact
from characterize.workloads.presets import Hotness, parse_dataset

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locking
    fcntl = None  # type: ignore[assignment]

META = artifact("meta").path
LOG = artifact("log").path
LOCK = artifact("lock").path
#: seconds a second writer waits for a run directory's lock (a killed writer's workers need a moment to exit)
LOCK_WAIT_S = 5.0


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


# ------------------------------------------------------------ validated reading
def _kind_ok(value: Any, kind: str) -> bool:
    """Whether a JSON value is of a declared field kind (characterize.rundir.Field)."""
    if kind.endswith("?"):
        if value is None:
            return True
        kind = kind[:-1]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {"object": isinstance(value, dict), "list": isinstance(value, list),
            "records": isinstance(value, list) and all(isinstance(v, dict) for v in value),
            "text": isinstance(value, str), "number": number, "flag": isinstance(value, bool),
            "numbers": isinstance(value, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                      for v in value.values()),
            "any": True}[kind]


_KIND_WORDS = {"object": "an object", "records": "a list of objects", "list": "a list", "text": "a string",
               "number": "a number", "numbers": "an object of numbers", "flag": "true or false", "any": "anything"}


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _field_problem(obj: Any, fields: tuple[Field, ...]) -> str | None:
    """What is wrong with one record against its declared fields, or None."""
    if not isinstance(obj, dict):
        return f"holds {_json_type(obj)} where an object is declared"
    for f in fields:
        if f.name not in obj:
            if f.required:
                return f"lacks its {f.name!r} field"
            continue
        if not _kind_ok(obj[f.name], f.kind):
            want = _KIND_WORDS[f.kind.rstrip("?")] + (" or null" if f.kind.endswith("?") else "")
            return f"field {f.name!r} holds {_json_type(obj[f.name])}, not {want}"
    return None


#: what to do about a damaged JSON artifact
_REPAIR = {"meta": "restore meta.json from a copy, or run the experiment again into another --out",
           "bench": "`--resume` measures the point again", "profile": "`--resume` profiles the point again",
           "locality": "`characterize run --resume` writes it again"}


def read_json(path: Path, key: str) -> Any:
    """See _read_json; the message ends with what to do about a damaged file."""
    try:
        return _read_json(path, key)
    except RunDirError as e:
        fix = _REPAIR.get(key, "the step that writes it writes it again")
        raise RunDirError(f"{e}; {fix}") from None


def _read_json(path: Path, key: str) -> Any:
    """A JSON artifact of a run directory (characterize.rundir key), read and checked
    against its declaration: unreadable, torn, not JSON, or of the wrong shape is a
    RunDirError naming the file and what is wrong with it."""
    a: Artifact = artifact(key)
    shown = escape_text(str(path))
    _regular(path, shown)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RunDirError(f"{shown}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                          "the file is damaged") from None
    except OSError as e:
        raise RunDirError(f"{shown}: cannot be read ({e.strerror or type(e).__name__})") from None
    try:
        obj = json.loads(text)
    except ValueError as e:
        torn = " (torn or cut short?)" if text.strip() else " (empty)"
        raise RunDirError(f"{shown}: not valid JSON{torn}: {str(e).splitlines()[0]}") from None
    if a.keyed:
        if not isinstance(obj, dict):
            raise RunDirError(f"{shown}: holds {_json_type(obj)} where an object of one record per {a.keyed} "
                              "is declared")
        for name, record in obj.items():
            problem = _field_problem(record, a.fields)
            if problem:
                raise RunDirError(f"{shown}: {a.keyed} {escape_text(str(name))!r} {problem}")
        return obj
    problem = _field_problem(obj, a.fields)
    if problem:
        raise RunDirError(f"{shown}: {problem}")
    for i, row in enumerate(obj.get("summary") or [] if a.columns else []):   # the rows of its declared table
        for col in a.columns:
            if col.unit and col.name in row and not _kind_ok(row[col.name], "number?"):
                raise RunDirError(f"{shown}: summary row {i + 1}: {col.name} ({col.unit}) holds "
                                  f"{_json_type(row[col.name])}, not a number")
    return obj


def _regular(path: Path, shown: str) -> None:
    """RunDirError unless `path` is a regular file (a FIFO would block the reader forever,
    a device would feed it without end)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise RunDirError(f"{shown}: cannot be read ({e.strerror or type(e).__name__})") from None
    if not stat.S_ISREG(mode):
        raise RunDirError(f"{shown}: is {file_kind(mode)}, not a file of the run")


# ------------------------------------------------------------- fingerprints
#: parts of a run's fingerprint, in the order a difference is named
FINGERPRINT_PARTS = ("toolkit", "backend", "gpu", "workload", "params", "settings", "trace")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise tagged(e, "read (to fingerprint it)") from None
    return h.hexdigest()


def kernel_sources_digest() -> str:
    """Digest of the kernel sources (kernels/*.cu, .cuh, .h): what a run's points were built from."""
    h = hashlib.sha256()
    for path in sorted(kernels_dir().glob("*")):
        if path.suffix in (".cu", ".cuh", ".h"):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def run_fingerprint(exp: Any, backend: str | None = None, gpu: str | None = None) -> dict[str, Any]:
    """What every point of `exp` depends on: the toolkit (version and kernel sources), the
    backend and GPU, the workload, each variant's parameters, the bench and profile
    settings (a point's timeout aside), and each trace file's contents (SHA-256). Stored in
    meta.json; each point records its own part (point_fingerprint)."""
    traces = {}
    for d in exp.datasets:
        parsed = parse_dataset(d)
        if not isinstance(parsed, Hotness) and Path(parsed).is_file():
            traces[d] = {"sha256": _sha256(Path(parsed)), "bytes": Path(parsed).stat().st_size}
    bench = dataclasses.asdict(exp.bench)
    bench.pop("timeout_s", None)   # how long a point may take changes nothing it measures
    bench.pop("stall_s", None)
    profile = dataclasses.asdict(exp.profile)
    # a profiled launch follows bench's warm-up batches: what a profile point measured depends on them
    profile["warmup_batches"] = exp.bench.warmup
    return {"toolkit": {"characterize": __version__, "kernels": kernel_sources_digest()},
            "backend": backend or "cuda", "gpu": gpu, "workload": exp.workload.to_dict(),
            "params": {v: dict(p) for v, p in exp.params.items()}, "bench": _plain(bench),
            "profile": _plain(profile), "traces": traces}


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(d, default=_json_default))


def point_fingerprint(run_fp: dict[str, Any] | None, kind: str, variant: str, dataset: str) -> dict[str, Any] | None:
    """The part of a run's fingerprint one (kind, variant, dataset) point depends on."""
    if not run_fp or not isinstance(run_fp, dict):
        return None
    params, traces = run_fp.get("params"), run_fp.get("traces")
    return {"toolkit": run_fp.get("toolkit"), "backend": run_fp.get("backend"), "gpu": run_fp.get("gpu"),
            "workload": run_fp.get("workload"), "params": params.get(variant, {}) if isinstance(params, dict) else params,
            "settings": run_fp.get(kind), "trace": traces.get(dataset) if isinstance(traces, dict) else traces}


def fingerprint_differences(old: dict[str, Any] | None, new: dict[str, Any], variant: str = "",
                            kind: str = "bench") -> list[str]:
    """What differs between two point fingerprints, in words ("rpf.P 2 -> 8", "the trace
    file x.npz changed"); old None: the point recorded none."""
    if not isinstance(old, dict):
        return ["the point records no fingerprint (measured before fingerprints, or damaged)"]
    out = []
    for part in FINGERPRINT_PARTS:
        a, b = old.get(part), new.get(part)
        if a == b:
            continue
        if part == "trace":
            before, after = (str(x.get("sha256", "none"))[:12] if isinstance(x, dict) else "none" for x in (a, b))
            out.append(f"the trace file's contents (SHA-256 {escape_text(before)}... -> {escape_text(after)}...)")
        elif part == "toolkit":
            out.append(f"the toolkit ({_changes(a, b, 'toolkit')})")
        elif isinstance(a, dict) and isinstance(b, dict):
            prefix = variant if part == "params" else "workload" if part == "workload" else kind
            out.append(_changes(a, b, prefix))
        else:
            out.append(escape_text(f"{part} {a!r} -> {b!r}")[:120] if part != "params" else
                       _changes(a or {}, b or {}, variant))
    return out


def _changes(a: Any, b: Any, prefix: str) -> str:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return f"{prefix} {a!r} -> {b!r}"
    keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    return ", ".join(escape_text(f"{prefix}.{k} {a.get(k, 'unset')!r} -> {b.get(k, 'unset')!r}")[:120] for k in keys)


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
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise tagged(e, "create the run directory") from None
        key = p.resolve()
        held = cls._held.get(key)
        if held is not None and held.fd is not None:
            return held
        if fcntl is None:  # pragma: no cover
            lock = cls(key, None)
            cls._held[key] = lock
            return lock
        try:
            fd = os.open(p / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except IsADirectoryError:
            raise RunDirError(f"{escape_text(str(p / LOCK))} is a directory, not the run directory's lock file; "
                              "remove it (nothing of the run is in it) or choose another --out") from None
        except OSError as e:
            raise tagged(e, "open the lock file") from None
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
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "command": shlex.join(sys.argv), "since": _now()}).encode())
        except OSError:  # a full disk: the flock holds all the same, only the holder's note is lost
            pass
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
        (its finished points are kept; meta.json then takes the new experiment and
        fingerprint, which `measure.runner.open_run` has checked against the points); a
        new one gets meta.json at once. Takes the directory's writer lock first:
        RunDirLocked while another process writes it."""
        p = Path(path)
        lock = RunLock.acquire(p)
        _remove_temporaries(p)
        if (p / META).is_file() and not resume:
            existing = read_json(p / META, "meta")
            raise RunDirError(f"{p} already holds a run ({existing['experiment'].get('name', '?')}, "
                              f"started {existing['started']}); pass --resume to continue it or "
                              "--out to choose another directory")
        run = cls(p, lock)
        if (p / META).is_file():
            old = read_json(p / META, "meta")
            old.setdefault("resumed", []).append(_now())
            for key in ("command_line", "environment", "fingerprint", "backend", "cache_control", "clock_control"):
                if key in meta:
                    old[key] = meta[key]
            if meta.get("gpu"):
                old["gpu"] = meta["gpu"]
            if "experiment" in meta:   # the points measured next read the experiment from here
                old["experiment"] = _merged_experiment(old.get("experiment") or {}, meta["experiment"])
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
    @property
    def meta(self) -> dict[str, Any]:
        """meta.json as it is now (validated; RunDirError when damaged)."""
        return read_json(self.path / META, "meta")

    def update_meta(self, **changes: Any) -> None:
        meta = self.meta
        meta.update(changes)
        write_json(self.path / META, meta)

    def log(self, message: str) -> None:
        """One timestamped line in log.txt; a log that cannot be written (a full disk)
        loses the line rather than the run."""
        try:   # never blocks: a FIFO or device put in the log's place is not written to
            fd = os.open(self.path / LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError:
            return
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.write(fd, f"{_now()} {message}\n".encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def expected_fingerprint(self, kind: str, variant: str, dataset: str) -> dict[str, Any] | None:
        """What a point measured now records (the run's fingerprint, that point's part)."""
        try:
            return point_fingerprint(self.meta.get("fingerprint"), kind, variant, dataset)
        except RunDirError:
            return None

    def point_path(self, kind: str, variant: str, dataset: str) -> Path:
        return self.path / artifact(kind).path.replace("*", point_key(variant, dataset))

    def has_point(self, kind: str, variant: str, dataset: str) -> bool:
        """True when the point finished with what the run measures now: status ok and the
        run's fingerprint (a failed, damaged or differently measured point is measured
        again)."""
        p = self.point_path(kind, variant, dataset)
        if not p.is_file():
            return False
        try:
            record = read_json(p, kind)
        except RunDirError:
            return False
        if record.get("status") != "ok":
            return False
        expected = self.expected_fingerprint(kind, variant, dataset)
        return expected is None or record.get("fingerprint") == expected

    def write_point(self, kind: str, variant: str, dataset: str, record: dict[str, Any]) -> Path:
        """Write a point atomically, stamped with what it was measured with (its part of
        the run's fingerprint)."""
        p = self.point_path(kind, variant, dataset)
        stamp = self.expected_fingerprint(kind, variant, dataset)
        head = {"kind": kind, "variant": variant, "dataset": dataset, "finished": _now()}
        write_json(p, {**head, **({"fingerprint": stamp} if stamp is not None else {}), **record})
        return p

    def annotate_point(self, kind: str, variant: str, dataset: str, **fields: Any) -> bool:
        """Add `fields` to a finished point's file (atomically); False when there is none."""
        p = self.point_path(kind, variant, dataset)
        try:
            record = read_json(p, kind)
        except RunDirError:
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


def _merged_experiment(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The experiment a resumed run records: the new one, whose variants and datasets
    keep those measured before (a resume of a subset does not forget the rest)."""
    out = dict(new)
    for key in ("variants", "datasets"):
        before = old.get(key) if isinstance(old.get(key), list) else []
        out[key] = list(dict.fromkeys([*before, *(new.get(key) or [])]))
    return out


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
        """A declared table artifact (characterize.rundir) as written, checked against its
        declaration (every column with a unit holds numbers); empty when the step that
        writes it has not run. A damaged file is a RunDirError naming it."""
        a = artifact(key)
        p = self.path / a.path
        if not p.exists():
            return pd.DataFrame()
        shown = escape_text(str(p))
        _regular(p, shown)
        try:
            df = pd.read_csv(p)
        except pd.errors.EmptyDataError:
            raise RunDirError(f"{shown}: empty; the {a.step} step writes it again") from None
        except UnicodeDecodeError as e:
            raise RunDirError(f"{shown}: not UTF-8 text (offset {e.start}); the file is damaged") from None
        except (ValueError, pd.errors.ParserError) as e:
            raise RunDirError(f"{shown}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
                from None
        except OSError as e:
            raise RunDirError(f"{shown}: cannot be read ({e.strerror or type(e).__name__})") from None
        return _checked_table(df, a, shown)

    def home(self, kind: str, variant: str, dataset: str) -> Path:
        """The run directory a point's files (its report) are relative to."""
        return self.path

    def points(self, kind: str) -> list[dict[str, Any]]:
        """Every point file of `kind` that reads as its declaration says and was measured
        with what the run records (its fingerprint); one that does not (torn, edited,
        foreign, stale) is listed in `unreadable_points`, not returned."""
        out = []
        fp = self.meta.get("fingerprint")
        for p in sorted(self.path.glob(artifact(kind).path)):
            try:
                point = read_json(p, kind)
            except RunDirError as e:
                variant, _, dataset = p.stem.partition("__")
                self._note({"kind": f"{kind} point file", "variant": variant, "dataset": dataset, "error": str(e)})
                continue
            want = point_fingerprint(fp, kind, point["variant"], point["dataset"])
            if fp and point.get("status") == "ok" and point.get("fingerprint") != want:
                why = "; ".join(fingerprint_differences(point.get("fingerprint"), want, point["variant"], kind))
                self._note({"kind": f"stale {kind} point", "variant": point["variant"], "dataset": point["dataset"],
                            "error": f"measured with something else than the run records now ({why}); "
                                     "`--resume --remeasure` measures it again"})
                continue
            out.append(point)
        return out

    def _note(self, bad: dict[str, str]) -> None:
        if bad not in self.unreadable_points:
            self.unreadable_points.append(bad)

    @cached_property
    def unreadable_points(self) -> list[dict[str, str]]:
        """Point files that cannot be read as points, or are stale (found by `points`);
        listed in `failures`."""
        return []

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
        rows = []
        for ds, s in self.locality_raw.items():
            row = {"dataset": ds, **{k: v for k, v in s.items() if not isinstance(v, (dict, list))}}
            for k, v in s.get("top_k_coverage", {}).items():
                row[f"top_{k}_coverage"] = v
            for k, v in s.get("reuse_distance_quantiles", {}).items():
                row[f"reuse_{k}"] = v
            rows.append(row)
        return pd.DataFrame(rows)

    @cached_property
    def locality_raw(self) -> dict[str, Any]:
        """locality.json as written (validated; RunDirError when damaged), {} before the step ran."""
        p = self.path / artifact("locality").path
        return read_json(p, "locality") if p.exists() else {}

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
        return pd.DataFrame(rows + self.unreadable_points + self.unreadable_reports + self.orphan_reports)

    @cached_property
    def orphan_reports(self) -> list[dict[str, str]]:
        """Reports in ncu/ that no profile point names: a profile stopped after ncu wrote the
        report but before the point was recorded. Never read as measurements (nothing says
        what they measured under), but said, not dropped."""
        named = {str(pt.get(k)) for pt in self.points("profile") for k in ("report", "cache_report") if pt.get(k)}
        out = []
        for f in sorted((self.path / "ncu").glob("*.ncu-rep")) if (self.path / "ncu").is_dir() else []:
            rel = f.relative_to(self.path).as_posix()
            if rel in named:
                continue
            variant, _, dataset = f.name.removesuffix(".ncu-rep").removesuffix(".cache").partition("__")
            out.append({"kind": "profile report", "variant": variant, "dataset": dataset,
                        "error": f"{rel} has no point file: the profile stopped before the point was recorded, so "
                                 "the report is not read; profile the point again (--resume)"})
        return out

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


def _checked_table(df: pd.DataFrame, a: Artifact, shown: str) -> pd.DataFrame:
    """A table as declared: every declared column that has a unit holds numbers (or is
    empty); text where a number belongs is a RunDirError naming the column and line."""
    for col in a.columns:
        if not col.unit or col.name not in df.columns:
            continue
        values = df[col.name]
        if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            continue
        numbers = pd.to_numeric(values, errors="coerce")
        bad = values.notna() & numbers.isna()
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise RunDirError(f"{shown}, line {i + 2}: column {col.name} ({col.unit}) holds "
                              f"{escape_text(str(values.iloc[i]))[:40]!r}, not a number; the file was damaged or "
                              f"edited; the {a.step} step writes it again")
        df[col.name] = numbers
    return df


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
        raise RunDirError(f"{escape_text(str(p))}: no such run directory")
    if not p.is_dir():
        raise RunDirError(f"{escape_text(str(p))} is a file, not a directory; give the run directory (for a report "
                          "file use `characterize import`)")
    if not (p / META).exists():
        raise RunDirError(f"{escape_text(str(p))} is not a run directory (no {META})")
    return Run(p, read_json(p / META, "meta"))


def same_experiment(a: Run, b: Run) -> bool:
    """Whether two runs measured one experiment on one GPU: the experiment's name and workload
    and the GPU agree (a bench from one machine and a profile from another merge; two GPUs,
    two workloads or two experiments stay apart)."""
    ea, eb = a.meta.get("experiment") or {}, b.meta.get("experiment") or {}
    ga, gb = (a.meta.get("gpu") or {}).get("key"), (b.meta.get("gpu") or {}).get("key")
    return bool(ea) and ea.get("name") == eb.get("name") and ea.get("workload") == eb.get("workload") and \
        (ga == gb or not ga or not gb)


def measured_keys(run: Run) -> set[tuple[str, str, str]]:
    """(kind, variant, dataset) of every bench and profile point the run holds."""
    return {(kind, str(pt.get("variant")), str(pt.get("dataset"))) for kind in ("bench", "profile")
            for pt in run.points(kind)}


def complementary(group: Sequence[Run], run: Run) -> bool:
    """Whether `run` completes `group` (runs of one experiment on one GPU, same_experiment):
    it measured points the group did not (a profile beside a bench, the rest of a matrix).
    Two runs of the same points, or two without measurements (no GPU), are two versions
    of one thing to compare, not halves of one run."""
    if not same_experiment(group[0], run):
        return False
    mine, theirs = measured_keys(run), set().union(*(measured_keys(g) for g in group))
    return bool(mine) and bool(theirs) and not (mine & theirs)


class MergedRun(Run):
    """Runs of one experiment on one GPU that complete each other read as one (complementary): bench points
    from one, profile points from another, a run measured on a GPU and its predictions added
    elsewhere. Points are their union (a later run's point replaces an earlier one's of the
    same variant, dataset and kind); tables and statistics come from the first run that has
    them; each profile report is read from its own run's directory."""

    def __init__(self, parts: Sequence[Run]):
        if len(parts) < 2:
            raise RunDirError("merging needs at least two runs")
        first = next((r for r in parts if (r.meta.get("gpu") or {}).get("key")), parts[0])
        meta = dict(first.meta)
        meta["merged_from"] = [str(r.path) for r in parts]
        super().__init__(first.path, meta)
        self.parts = list(parts)

    @property
    def name(self) -> str:
        return " + ".join(r.name for r in self.parts)

    def table(self, key: str) -> pd.DataFrame:
        for r in self.parts:
            df = r.table(key)
            if not df.empty:
                return df
        return pd.DataFrame()

    def points(self, kind: str) -> list[dict[str, Any]]:
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for r in self.parts:
            for pt in r.points(kind):
                out[(pt["variant"], pt["dataset"])] = pt
        return list(out.values())

    def home(self, kind: str, variant: str, dataset: str) -> Path:
        """The part that holds the point (the last one, as `points` reads them)."""
        for r in reversed(self.parts):
            if any(pt["variant"] == variant and pt["dataset"] == dataset for pt in r.points(kind)):
                return r.home(kind, variant, dataset)
        return self.path

    @cached_property
    def unreadable_points(self) -> list[dict[str, str]]:
        return [u for r in self.parts for u in r.unreadable_points]

    @cached_property
    def unreadable_reports(self) -> list[dict[str, str]]:
        return [u for r in self.parts for u in r.unreadable_reports]

    @cached_property
    def orphan_reports(self) -> list[dict[str, str]]:
        return [u for r in self.parts for u in r.orphan_reports]

    @cached_property
    def locality_raw(self) -> dict[str, Any]:
        return next((r.locality_raw for r in self.parts if r.locality_raw), {})

    @cached_property
    def metrics(self) -> pd.DataFrame:
        """Each part's profiled points, from its own reports (a later part's point of the same
        variant and dataset replaces an earlier one's)."""
        frames, seen = [], set()
        for r in reversed(self.parts):
            m = r.metrics
            if m.empty:
                continue
            keep = ~pd.Series(list(zip(m["variant"], m["dataset"])), index=m.index).isin(seen)
            seen |= set(zip(m["variant"], m["dataset"]))
            frames.append(m[keep])
        return pd.concat(frames[::-1], ignore_index=True) if frames else pd.DataFrame()


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Open run directories, the runs that complete each other (complementary: one
    experiment on one GPU, different points measured) merged into one (MergedRun), in
    the order given (a merged run where its first part was)."""
    runs = [load_run(p) for p in paths]
    groups: list[list[Run]] = []
    for r in runs:
        home = next((g for g in groups if complementary(g, r)), None)
        if home is None:
            groups.append([r])
        else:
            home.append(r)
    return [g[0] if len(g) == 1 else MergedRun(g) for g in groups]


def list_runs(root: str | Path) -> list[Path]:
    """Run directories directly under `root`."""
    return sorted(d for d in Path(root).iterdir() if (d / META).is_file()) if Path(root).is_dir() else []
