"""Pipeline, predictions: the model over an experiment (kept on disk under a digest of what it
depends on), the model against the paper's claims, and calibration to a measured run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import pickle
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.calibrate import Calibration, fit_run, save_calibration, timed_gpu
from characterize.analysis.claims import CLAIM_ARCH, CLAIM_VARIANTS, paper_claims
from characterize.analysis.model.constants import calibration_dir
from characterize.analysis.model.locality import shared_profiles
from characterize.analysis.model.predict import predict_experiment as model_predictions
from characterize.config import ExperimentConfig, WorkloadConfig
from characterize.hardware.specs import gpu_spec
from characterize.kernels.build import buildable_arch
from characterize.kernels.diskcache import entry, entry_key, get_or_compute, read_entry, source_digest, write_entry
from characterize.kernels.registry import (
    get_variant,
)
from characterize.pipeline.experiment import check_fit
from characterize.pipeline.facts import CodeFacts, code_facts, reads, user_sass
from characterize.progress import PerMessage, Progress, Reporter, as_reporter
from characterize.store import load_run
from characterize.workloads.locality import shared_reuse
from characterize.workloads.presets import Hotness, parse_dataset
from characterize.workloads.traces import shared_datasets


def predict(exp: ExperimentConfig, archs: Sequence[str] | None = None, *, code: CodeFacts | None = None,
            progress: Reporter | Progress | None = None, cache_ratios: Sequence[float] | None = None,
            profiles: dict | None = None, mode: str | Sequence[str] = "steady") -> pd.DataFrame:
    """Model predictions for `exp` on `archs` (architectures or GPU names), compiling
    what the model needs unless `code` already covers it; `cache_ratios` sweeps the
    cache variant's size (shares of E). The experiment's extra `dtypes` are predicted
    too (each variant that reads them at D), one row per dtype, for the precision grid.
    `mode`: steady (tables in turn, as in production), cold (L2 flushed before each
    launch, as a benchmark that flushes measures), or both."""
    # each trace read and analyzed once for every precision
    with shared_datasets(), shared_reuse(), shared_profiles():
        return _predict(exp, archs, code=code, progress=progress, cache_ratios=cache_ratios, profiles=profiles,
                        mode=mode)


def _predict(exp: ExperimentConfig, archs: Sequence[str] | None = None, *, code: CodeFacts | None = None,
             progress: Reporter | Progress | None = None, cache_ratios: Sequence[float] | None = None,
             profiles: dict | None = None, mode: str | Sequence[str] = "steady") -> pd.DataFrame:
    targets = list(archs or exp.archs)
    if cache_ratios and "cache" not in exp.variants:   # a cache-size sweep is about the cache variant
        exp = dataclasses.replace(exp, variants=(*exp.variants, "cache"))
    for t in targets:  # a prediction for a GPU the workload cannot fit is refused, not made up
        check_fit(exp, gpu_spec(t))
    gpu_archs = list(dict.fromkeys(gpu_spec(a).arch for a in targets))
    # host-resident variants run base's kernel: base's code facts are theirs (and every row's reference,
    # where base reads the tables: not fp8, which tbe alone reads)
    ref = ["base"] if reads("base", exp.workload) else []
    names = list(dict.fromkeys([*ref, *(v for v in exp.variants if get_variant(v).host == "none")]))
    dtype = exp.workload.dtype
    if code is None or not code.covers(names, gpu_archs, exp.workload.D, dtype):
        # an architecture this nvcc cannot build (CUDA 13: Volta) is modelled from the closest one it can
        code_archs = list(dict.fromkeys(buildable_arch(a) for a in gpu_archs))
        if code is None or not code.covers(names, code_archs, exp.workload.D, dtype):
            code = code_facts(names, code_archs, exp.workload.D, exp.params, dtype=dtype, progress=progress,
                              also_dtypes=exp.dtypes)
    rep = as_reporter(progress)
    custom = user_sass(exp, gpu_archs, rep)
    key = None
    if profiles is None:   # the whole experiment (every precision): kept in the build cache
        key = _predictions_key(exp, targets, code, custom, cache_ratios, mode)
        kept = _kept_predictions(key)
        if kept is not None:
            with rep.task(f"{dtype} predictions for {', '.join(targets)}") as task:
                task.finish(f"{len(kept)} point(s), kept from an earlier run of the same inputs")
            return kept
    with rep.task(f"{dtype} predictions for {', '.join(targets)}", total=len(exp.datasets),
                  unit="datasets") as task:
        per = PerMessage(task, len(exp.datasets))
        profiles = {} if profiles is None else profiles   # the traces' locality, shared by every dtype
        df = model_predictions(exp, targets, static=code.static, sass=code.sass, progress=per,
                               cache_ratios=cache_ratios, profiles=profiles, custom=custom, mode=mode)
        per.close()
        task.finish(f"{len(df)} point(s) predicted")
    for dt in dict.fromkeys(exp.dtypes):
        if dt == exp.workload.dtype:
            continue
        wl = exp.workload.replace(dtype=dt)
        other = dataclasses.replace(exp, workload=wl, dtypes=(), variants=tuple(v for v in exp.variants
                                                                                if reads(v, wl)))
        if not other.variants:   # none of the experiment's variants reads this dtype (fp8: tbe alone)
            continue
        df = pd.concat([df, predict(other, targets, code=code, progress=progress, cache_ratios=cache_ratios,
                                    profiles=profiles, mode=mode)],
                       ignore_index=True)
    return df if key is None else _keep_predictions(key, df)


def _predictions_key(exp: ExperimentConfig, targets: Sequence[str], code: CodeFacts, custom: Mapping[str, Any],
                     cache_ratios: Sequence[float] | None, mode: str | Sequence[str]) -> str:
    """Everything an experiment's predictions depend on, digested: the experiment, the
    targets, the kernels' facts, the package's code and data, the stored calibrations and
    each trace file's identity (path, size, modification time)."""
    parts = [json.dumps([exp.to_dict(), list(targets), list(cache_ratios or []), mode, custom, pd.__version__,
                         np.__version__], sort_keys=True, default=str).encode()]
    parts += [b"|" + (frame.to_csv(index=False).encode() if frame is not None else b"")
              for frame in (code.static, code.sass)]
    parts += [dataset_identity(spec).encode() for spec in exp.datasets]
    return _inputs_digest(parts)


def dataset_identity(spec: str) -> str:
    """What a dataset's traces depend on beyond the workload: a generated one's spec, a trace
    file's path, size and modification time (a file rewritten is another dataset)."""
    parsed = parse_dataset(spec)
    if isinstance(parsed, Hotness):
        return spec
    try:
        st = Path(parsed).stat()
    except OSError:
        return spec
    return f"{Path(parsed).resolve()}:{st.st_size}:{st.st_mtime_ns}"


def cache_key(*parts: str | bytes) -> str:
    """A disk-cache key for what the pipeline works out from `parts`: the package's code and
    data and the stored calibrations are always part of it."""
    return _inputs_digest(p.encode() if isinstance(p, str) else p for p in parts)


def _kept_predictions(key: str) -> pd.DataFrame | None:
    """Predictions an earlier run kept under `key` in the disk cache, or None (a damaged,
    truncated, foreign entry, or one from another pandas, is None). Pickled, as the
    in-memory frame is (empty notes stay empty strings, attrs stay): the cache is trusted
    like the libraries it holds, which are loaded as they are."""
    df = read_entry(entry("predictions", key, ".pkl"), pd.read_pickle)
    return df if isinstance(df, pd.DataFrame) else None


def _keep_predictions(key: str, df: pd.DataFrame) -> pd.DataFrame:
    """Keep `df` under `key` (a read-only cache keeps nothing; the predictions stand)."""
    write_entry(entry("predictions", key, ".pkl"), pickle.dumps(df, protocol=pickle.HIGHEST_PROTOCOL))
    return df


def predict_experiment(exp: ExperimentConfig, archs: Sequence[str] | None = None, **kwargs: Any) -> pd.DataFrame:
    """The same as `predict` (compiling what the model reads), under the name notebooks use."""
    return predict(exp, archs, **kwargs)


def model_validation(code: CodeFacts | None = None, progress: Reporter | Progress | None = None) -> pd.DataFrame:
    """The model against the paper's A100 claims, at the paper's configuration. The same for
    every experiment, and seconds of trace analysis at the paper's size: kept in the build
    cache, keyed by everything it depends on (the claims' kernels' facts, the package's
    code and data, the stored calibrations); a damaged entry is computed again."""
    wl = WorkloadConfig.paper()
    if code is None or not code.covers(CLAIM_VARIANTS, [CLAIM_ARCH], wl.D):
        code = code_facts(CLAIM_VARIANTS, [CLAIM_ARCH], wl.D, progress=progress)
    # runs started together compute it once; the answer is the entry as a later run reads it back
    return get_or_compute("claims", _claims_key(code),
                          lambda: paper_claims(wl, CLAIM_ARCH, static=code.static, sass=code.sass),
                          read=pd.read_csv, write=lambda claims: claims.to_csv(index=False), suffix=".csv", lock=True)


def _claims_key(code: CodeFacts) -> str:
    """What the paper claims' check depends on, digested."""
    return _inputs_digest(frame[frame["variant"].isin(CLAIM_VARIANTS) & (frame["arch"] == CLAIM_ARCH)]
                          .to_csv(index=False).encode()
                          for frame in (code.static, code.sass)
                          if frame is not None and not frame.empty and {"variant", "arch"} <= set(frame.columns))


def _inputs_digest(parts: Iterable[bytes]) -> str:
    """A cache key: the package's code and data, `parts`, then the stored calibrations (the
    model's constants per GPU), digested."""
    calibrations = []
    folder = calibration_dir()
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            calibrations.append(f.name.encode() + f.read_bytes())
    return entry_key(_package_digest(), *parts, *calibrations)


@functools.lru_cache(maxsize=1)
def _package_digest() -> str:
    """The package's code and data (the model, its corpus, the presets, the spec table):
    every file of characterize/, not only of this folder."""
    return source_digest(Path(__file__).resolve().parents[1], (".py", ".csv", ".json", ".toml"))


def calibrate(run_dir: str | Path, gpu: str | None = None, progress: Progress | None = None) -> Calibration:
    """Fit the model to a measured run (compiling what the model needs for its GPU if
    the run lacks it) and store the constants for that GPU."""
    run = load_run(run_dir)
    arch = timed_gpu(run, gpu).arch   # before compiling anything: timings of that GPU, not the CPU emulation's
    exp = ExperimentConfig.from_dict(run.meta.get("experiment") or {})
    code = CodeFacts(exp.workload.D, run.static, run.sass)
    names = list(dict.fromkeys(["base", *exp.variants]))
    if not code.covers(names, [arch], exp.workload.D):
        code = code_facts(names, [arch], exp.workload.D, exp.params, dtype=exp.workload.dtype)
    cal = fit_run(run, gpu, static=code.static, sass=code.sass, progress=progress)
    save_calibration(cal)
    return cal

