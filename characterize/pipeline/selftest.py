"""Pipeline, the self-test: the whole GPU path on one GPU within a time budget, planned in the
order of what each step is worth.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from characterize.analysis.model.locality import shared_profiles
from characterize.config import DTYPES, ExperimentConfig, WorkloadConfig
from characterize.errors import (
    CharacterizeError,
    NcuPermissionError,
    NoCudaDevice,
    OutOfTime,
    describe_os_error,
)
from characterize.files import write_atomic
from characterize.hardware.devices import require_gpu
from characterize.hardware.specs import gpu_spec
from characterize.kernels.check import CheckResult, check_variants
from characterize.kernels.registry import (
    HOST_VARIANTS,
    VARIANT_ORDER,
    get_variant,
)
from characterize.measure.runner import (
    profile_estimate,
)
from characterize.pipeline.dlrm import e2e, e2e_estimate
from characterize.pipeline.experiment import load_experiment
from characterize.pipeline.steps import (
    RunOutcome,
    StepContext,
    bench_step,
    locality_step,
    open_experiment_run,
    predict_step,
    profile_step,
    report_step,
    static_step,
    sweeps_step,
)
from characterize.progress import Progress, Reporter, as_reporter
from characterize.store import load_run
from characterize.workloads.locality import shared_reuse
from characterize.workloads.traces import shared_datasets

SELFTEST_EXPERIMENT = "selftest"


#: what the self-test checks on the device: every variant x dtype once (sum), and every variant in mean mode
SELFTEST_CHECK_DATASET = "medium"


#: the self-test's default time budget: a short loan of a GPU or a cluster job's limit
SELFTEST_BUDGET_S = 480.0


#: timed DLRM steps per variant in the self-test (the `e2e` command takes 20)
SELFTEST_E2E_REPS = 10


@dataclass(frozen=True)
class SelftestCosts:
    """Seconds each unit of the self-test costs, as planned (upper bounds; the profile's and
    the DLRM step's own estimates come from measure.runner.ProfileCosts and E2ECosts)."""

    build_s: float = 15.0           # one nvcc build of the family, one core (a cold cache; a warm one costs ~0)
    check_s: float = 0.5            # one device check at the tiny shape (B=127), library already loaded
    worker_start_s: float = 10.0    # a bench worker: python, torch and CUDA context, tables generated
    point_overhead_s: float = 2.0   # a bench point's bind, check and warm-up batches
    report_s: float = 30.0          # the static step's builds and SASS reading, locality, predictions, the report


@dataclass(frozen=True)
class PlannedStep:
    """One step of the self-test as planned: its estimate, and whether the budget holds it."""

    name: str
    units: int
    seconds: float
    what: str
    fits: bool = True
    why: str = ""      # why it was cut, when it does not fit


@dataclass(frozen=True)
class SelftestPlan:
    """What `selftest --gpu` will do, in the order of what it is worth, and what the budget cuts."""

    steps: tuple[PlannedStep, ...]
    budget_s: float = SELFTEST_BUDGET_S

    @property
    def seconds(self) -> float:
        """Seconds the steps that fit should take."""
        return sum(st.seconds for st in self.steps if st.fits)

    def step(self, name: str) -> PlannedStep:
        return next(st for st in self.steps if st.name == name)

    def lines(self) -> list[str]:
        cut = [st.name for st in self.steps if not st.fits]
        out = [f"self-test plan: about {self.seconds:.0f} s of a {self.budget_s:.0f} s budget"
               + (f" ({', '.join(cut)} cut)" if cut else "")]
        for st in self.steps:
            tail = st.what if st.fits else f"CUT: {st.why}"
            out.append(f"  {st.name:8s} {st.units:4d} x  {st.seconds:6.0f} s  {tail}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"budget_s": self.budget_s, "seconds": self.seconds,
                "steps": [dataclasses.asdict(st) for st in self.steps]}


def selftest_checks() -> list[tuple[str, str]]:
    """(mode, dtype) groups the device check covers: every dtype in sum mode, fp32 in mean mode."""
    return [("sum", dt) for dt in DTYPES] + [("mean", "fp32")]


def selftest_plan(exp: ExperimentConfig, cores: int = 16, costs: SelftestCosts = SelftestCosts(),
                  budget_s: float = SELFTEST_BUDGET_S) -> SelftestPlan:
    """The self-test's steps in the order of what each is worth, each with its estimate, and
    which the budget holds: the device check of every variant x dtype (builds included), bench
    of the experiment in its modes, ncu of every variant on its first dataset (one process
    and the cache counters), the DLRM step timed on that dataset, and the report (static
    facts, locality, predictions), whose time is kept aside first: it always runs."""
    names = [n for n in VARIANT_ORDER + HOST_VARIANTS if not get_variant(n).test_only]
    check_runs = len(names) * len(selftest_checks())
    builds = len(DTYPES) * 2   # each dtype: uncapped and at the cap
    check_s = costs.build_s * builds / max(1, min(cores, builds)) + check_runs * costs.check_s
    points = len(exp.variants) * len(exp.datasets)
    per_point = costs.point_overhead_s + len(exp.bench.modes) * (exp.bench.budget_s + 1.0)
    bench_s = costs.worker_start_s + points * per_point
    first = exp.datasets[:1]
    profiled = profile_estimate(exp, [(v, d) for d in first for v in exp.variants])
    e2e_variants = len(dict.fromkeys(["base", *exp.variants]))
    e2e_s = e2e_estimate(exp.workload, e2e_variants, len(first), SELFTEST_E2E_REPS)
    planned = [
        ("check", check_runs, check_s, f"each variant x dtype once on the device ({SELFTEST_CHECK_DATASET}, sum), "
                                       "and in mean mode"),
        ("bench", points, bench_s, f"{len(exp.variants)} variants x {len(exp.datasets)} datasets, modes "
                                   f"{', '.join(exp.bench.modes)}, {exp.bench.budget_s:g} s budget each"),
        ("profile", len(exp.variants), profiled.seconds, f"every variant on {', '.join(first)} under one ncu "
                                                         f"process, then its cache counters ({profiled.describe()})"),
        ("e2e", e2e_variants, e2e_s, f"the DLRM step timed around each variant on {', '.join(first)}, inference and "
                                     f"training, {SELFTEST_E2E_REPS} steps each"),
    ]
    left = budget_s - costs.report_s
    steps = []
    for name, units, seconds, what in planned:
        fits = seconds <= left
        why = "" if fits else f"would take about {seconds:.0f} s, {max(0.0, left):.0f} s of the budget left"
        left -= seconds if fits else 0.0
        steps.append(PlannedStep(name, units, seconds, what, fits, why))
    steps.append(PlannedStep("report", 1, costs.report_s, "static facts and SASS, locality, predictions, the HTML "
                                                          "report (always: its time is kept aside first)"))
    return SelftestPlan(tuple(steps), budget_s)


@dataclass
class SelftestOutcome:
    checks: list[CheckResult]
    run: RunOutcome
    seconds: float
    problems: list[str]   # empty: the whole GPU path works on this GPU (or every cut is said)
    plan: SelftestPlan | None = None
    archive: Path | None = None


#: the self-test's own record in its run directory: the plan, each step's outcome and time, the checks
SELFTEST_RECORD = "selftest.json"


def selftest_gpu(out: Path | None = None, *, ncu: str | None = None, resume: bool = False,
                 progress: Reporter | Progress | None = None, budget_s: float = SELFTEST_BUDGET_S,
                 experiment: str = SELFTEST_EXPERIMENT, backend: str = "cuda") -> SelftestOutcome:
    """The whole GPU path on this machine's first GPU within `budget_s`: the plan first (what
    fits, what is cut and why), then each step that fits under the time left, in the order
    of what it is worth (selftest_plan), into one run directory (profiles/<gpu>/selftest) with
    its record (selftest.json: the plan, each step's outcome and seconds, the checks) and one
    archive of it beside it (<run>.tar.gz), written after every step. `resume` continues: the
    steps done are kept, the rest runs under a new budget. Raises NoCudaDevice without a GPU
    (backend "emulate" rehearses it on the CPU emulation). Nothing is hidden: a failed check,
    a failed or cut step, or a failed point is a problem."""
    import shutil

    rep = as_reporter(progress)
    exp = load_experiment(experiment)
    plan = selftest_plan(exp, os.cpu_count() or 1, budget_s=budget_s)
    for line in plan.lines():
        rep.message(line)
    gpu = require_gpu() if backend == "cuda" else None
    key = gpu.spec().key if gpu is not None else "cpu-emulation"
    path = out or Path("profiles") / key / "selftest"
    start = time.monotonic()
    deadline = start + budget_s
    run = open_experiment_run(exp, path, "bench", resume, gpu, backend)
    record_path = run.path / SELFTEST_RECORD
    record = json.loads(record_path.read_text()) if resume and record_path.is_file() else {}
    done = {k for k, v in record.get("steps", {}).items() if v.get("status") == "done"}
    record = {"plan": plan.to_dict(), "steps": {k: v for k, v in record.get("steps", {}).items() if k in done},
              "checks": record.get("checks", []), "backend": backend, "resumed": bool(done)}
    outcome = RunOutcome(run.path)
    ctx = StepContext(exp, run, rep, backend, "local", ncu, gpu, outcome, deadline)
    checks: list[CheckResult] = []
    archive = run.path.parent / f"{run.path.name}.tar.gz"

    def keep(name: str, status: str, seconds: float, note: str = "") -> None:
        record["steps"][name] = {"status": status, "seconds": round(seconds, 1),
                                 "planned_s": round(plan.step(name).seconds, 1), "note": note}
        outcome.steps[name] = status if not note else f"{status}: {note}"
        run.log(f"selftest {name}: {status} in {seconds:.1f} s (planned {plan.step(name).seconds:.0f} s)"
                + (f": {note}" if note else ""))
        write_atomic(record_path, json.dumps(record, indent=1, default=str))
        try:
            shutil.make_archive(str(archive).removesuffix(".tar.gz"), "gztar", root_dir=run.path.parent,
                                base_dir=run.path.name)
        except OSError as e:   # the run directory stands; only the archive is missing
            rep.message(f"the self-test's archive could not be written: {describe_os_error(e)}")

    def check() -> None:
        spec = gpu.spec() if gpu is not None else gpu_spec(exp.archs[0])
        with rep.task("check every variant x dtype once on the device") as task:
            for mode, dtype in selftest_checks():
                if time.monotonic() >= deadline:
                    raise OutOfTime(f"checks of {mode}/{dtype} and after were not run")
                checks.extend(check_variants(None, [SELFTEST_CHECK_DATASET], WorkloadConfig.tiny(), (mode,),
                                             backend, dtypes=[dtype], gpu=spec))
            task.finish(f"{sum(c.passed is True for c in checks)} passed, "
                        f"{sum(c.passed is False for c in checks)} failed, {sum(c.passed is None for c in checks)} "
                        "skipped by design")
        record["checks"] = [dataclasses.asdict(c) for c in checks]

    def profile() -> None:
        ctx.exp = dataclasses.replace(exp, datasets=exp.datasets[:1])
        try:
            profile_step(ctx)
        finally:
            ctx.exp = exp

    def dlrm() -> None:
        out_e2e = e2e(exp, datasets=exp.datasets[:1], reps=SELFTEST_E2E_REPS, check=False, progress=rep,
                      predictions=None if load_run(run.path).predictions.empty else load_run(run.path).predictions)
        run.write("e2e", out_e2e.rows)

    def report() -> None:
        code = static_step(run, exp, rep)
        locality_step(run, exp, rep)
        predict_step(run, exp, code, rep)
        sweeps_step(run, exp, rep)
        report_step(ctx)

    actions = {"check": check, "bench": lambda: bench_step(ctx), "profile": profile, "e2e": dlrm, "report": report}
    with shared_datasets(), shared_reuse(), shared_profiles():
        for st in plan.steps:
            if st.name in done:
                rep.message(f"{st.name}: done in the run resumed, kept")
                continue
            if not st.fits:
                keep(st.name, "cut", 0.0, st.why)
                continue
            if st.name != "report" and time.monotonic() >= deadline:
                keep(st.name, "cut", 0.0, "the time budget ran out before it started")
                continue
            begun = time.monotonic()
            try:
                actions[st.name]()
            except OutOfTime as e:
                keep(st.name, "cut", time.monotonic() - begun, str(e))
            except CharacterizeError as e:
                keep(st.name, "failed", time.monotonic() - begun, str(e).splitlines()[0])
                if isinstance(e, (NoCudaDevice, NcuPermissionError)):
                    rep.message(f"{st.name} failed: {e}")
            except OSError as e:
                keep(st.name, "failed", time.monotonic() - begun, describe_os_error(e))
            else:
                keep(st.name, "done", time.monotonic() - begun)
    seconds = time.monotonic() - start
    record["seconds"] = round(seconds, 1)
    write_atomic(record_path, json.dumps(record, indent=1, default=str))
    shutil.make_archive(str(archive).removesuffix(".tar.gz"), "gztar", root_dir=run.path.parent, base_dir=run.path.name)
    bad = [c for c in checks if c.passed is False]
    problems = [f"check {c.variant} {c.dtype} {c.dataset} {c.mode}: max error {c.max_abs_err:.3g} over "
                f"{c.tolerance:.3g}{' (' + c.error + ')' if c.error else ''}" for c in bad]
    problems += [f"{name}: {v['status']}{': ' + v['note'] if v['note'] else ''}"
                 for name, v in record["steps"].items() if v["status"] != "done"]
    failures = load_run(run.path).failures
    problems += [f"{r.get('kind', '?')} {r.get('variant', '?')} {r.get('dataset', '?')}: {r.get('error', '')}"
                 for r in failures.to_dict("records")]
    if seconds > budget_s:
        rep.message(f"the self-test took {seconds:.0f} s, over its budget of {budget_s:.0f} s: see "
                    f"{record_path.name} for which step")
    return SelftestOutcome(checks, outcome, seconds, problems, plan, archive)

