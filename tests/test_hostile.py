"""Hostile input, class by class (issue 26): nothing breaks (one line and an exit code of
its kind, never a traceback, a hang or a signal), nothing is mixed (a resumed run never
measures with other settings than its points), nothing is destroyed (an output never
replaces a device, a FIFO or an input). Fuzzed run-directory and calibration readers are
in tests/test_rundir_fuzz.py."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner, Result

from characterize.analysis.model.constants import calibration_path
from characterize.cli import main
from characterize.config import WorkloadConfig
from characterize.errors import BuildError, OutputError, RunDirError, WorkloadError, describe_os_error
from characterize.files import write_atomic
from characterize.kernels import build as B
from characterize.measure.runner import pending_points
from characterize.pipeline import load_experiment, open_experiment_run
from characterize.store import RunDir, load_run
from characterize.workloads.traces import load_trace
from tests.conftest import HAS_GPU, write_experiment
from tests.test_bad_input import refused
from tests.test_rundir_fuzz import valid_run

CSV_DIR = Path(__file__).parent / "data" / "ncu_csv"
DETAILS = CSV_DIR / "a100_msdkt23_details.csv"


def cli(*args: object, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def program(*args: object, cwd: Path | None = None, stdout: object = subprocess.PIPE) -> subprocess.CompletedProcess:
    """The CLI as its own process (what a shell runs: real stdout, real working directory)."""
    return subprocess.run([sys.executable, "-m", "characterize.cli", *map(str, args)], cwd=cwd, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})


def one_error_line(stderr: str, *needles: str) -> str:
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and stderr.rstrip().splitlines()[-1] == errors[0] and "Traceback" not in stderr, stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


def experiment(tmp_path: Path, P: int = 2, warmup: int = 1, datasets=("medium",), name: str = "tiny") -> Path:
    """The tiny experiment (two variants) with rpf's P and bench.warmup as given."""
    p = write_experiment(tmp_path, name=name, variants=("base", "rpf"), datasets=datasets)
    text = p.read_text().replace("warmup = 1\n", f"warmup = {warmup}\n", 1)
    p.write_text(text + f"\n[params.rpf]\nP = {P}\n")
    return p


def finish(run: RunDir, exp) -> list[tuple[str, str]]:
    """Record every pending bench point of `exp` as finished (what a worker writes)."""
    points = pending_points(run, "bench", exp)
    for v, d in points:
        run.write_point("bench", v, d, {"status": "ok", "backend": "emulate",
                                        "summary": [{"mode": "steady", "per_table_us": 10.0, "ci95_us": 0.1}]})
    return points


# ============================================ 1. resume never mixes what points measured
def test_a_resume_with_other_parameters_is_refused_naming_them_and_remeasures_only_those(tmp_path):
    out = tmp_path / "run"
    exp = load_experiment(str(experiment(tmp_path, P=2)))
    run = open_experiment_run(exp, out, "bench", False, None, backend="emulate")
    assert len(finish(run, exp)) == 2
    changed = load_experiment(str(experiment(tmp_path, P=7)))
    with pytest.raises(RunDirError, match=r"rpf\.P 2 -> 7") as e:
        open_experiment_run(changed, out, "bench", True, None, backend="emulate")
    assert "--remeasure" in str(e.value) and "1 bench" in str(e.value)
    run = open_experiment_run(changed, out, "bench", True, None, backend="emulate", remeasure=True)
    assert pending_points(run, "bench", changed) == [("rpf", "medium")]   # base is kept
    stored = load_run(out)
    assert stored.meta["experiment"]["params"]["rpf"]["P"] == 7   # what the bench worker reads
    assert list(stored.bench["variant"]) == ["base"]   # the stale point is never shown as a result
    assert "rpf.P 2 -> 7" in stored.failures.set_index("kind").loc["stale bench point", "error"]
    # the CLI says the same, as one line, before any work
    r = cli("bench", experiment(tmp_path, P=5), "--backend", "emulate", "--out", out, "--resume")
    refused(r, 8, "rpf.P 2 -> 5", "--remeasure")


def test_a_replaced_trace_file_or_other_bench_settings_are_named(tmp_path):
    trace = tmp_path / "t.txt"
    trace.write_text("\n".join(str(i % 97) for i in range(3001)) + "\n")
    out = tmp_path / "run"
    exp = load_experiment(str(experiment(tmp_path, datasets=(str(trace),))))
    finish(open_experiment_run(exp, out, "bench", False, None, backend="emulate"), exp)
    trace.write_text("\n".join(str(i % 89) for i in range(3001)) + "\n")   # same name, other lookups
    with pytest.raises(RunDirError, match="the trace file's contents"):
        open_experiment_run(exp, out, "bench", True, None, backend="emulate")
    trace.write_text("\n".join(str(i % 97) for i in range(3001)) + "\n")   # back: nothing differs
    open_experiment_run(exp, out, "bench", True, None, backend="emulate")
    warmer = load_experiment(str(experiment(tmp_path, warmup=4, datasets=(str(trace),))))
    with pytest.raises(RunDirError, match=r"bench\.warmup 1 -> 4"):
        open_experiment_run(warmer, out, "bench", True, None, backend="emulate")
    with pytest.raises(RunDirError, match=r"backend 'emulate' -> 'cuda'"):   # CPU timings beside GPU ones
        open_experiment_run(exp, out, "bench", True, None, backend="cuda", executor="slurm")


def test_profile_points_answer_to_the_profile_settings(tmp_path):
    out = tmp_path / "run"
    exp = load_experiment(str(experiment(tmp_path)))
    run = open_experiment_run(exp, out, "profile", False, None, backend="emulate")
    run.write_point("profile", "base", "medium", {"status": "ok", "report": "ncu/base__medium.ncu-rep"})
    flushed = dataclasses.replace(exp, profile=dataclasses.replace(exp.profile, cache_control="all"))
    with pytest.raises(RunDirError, match=r"1 finished point\(s\) \(1 profile\) .*profile\.cache_control 'none' -> 'all'"):
        open_experiment_run(flushed, out, "profile", True, None, backend="emulate")
    # bench's other settings are not what a profile point measured with; its warm-up is (profile follows it)
    open_experiment_run(dataclasses.replace(exp, bench=dataclasses.replace(exp.bench, budget_s=exp.bench.budget_s * 2)), out, "profile",
                        True, None, backend="emulate")
    with pytest.raises(RunDirError, match=r"profile\.warmup_batches 1 -> 5"):
        open_experiment_run(dataclasses.replace(exp, bench=dataclasses.replace(exp.bench, warmup=5)), out, "profile",
                            True, None, backend="emulate")


@pytest.mark.slow
def test_a_remeasured_resume_times_with_the_new_parameters_and_keeps_the_rest(tmp_path):
    out = tmp_path / "run"
    first = program("bench", experiment(tmp_path, P=2), "--backend", "emulate", "--out", out)
    assert first.returncode == 0, first.stderr
    base = (out / "points" / "bench" / "base__medium.json").read_text()
    refused_run = program("bench", experiment(tmp_path, P=4), "--backend", "emulate", "--out", out, "--resume")
    assert refused_run.returncode == 8
    one_error_line(refused_run.stderr, "rpf.P 2 -> 4", "--remeasure")
    again = program("bench", experiment(tmp_path, P=4), "--backend", "emulate", "--out", out, "--resume",
                    "--remeasure")
    assert again.returncode == 0 and "1 point(s) to time" in again.stderr, again.stderr
    points = {p["variant"]: p for p in load_run(out).points("bench")}
    assert points["rpf"]["params"]["P"] == 4 and points["rpf"]["fingerprint"]["params"] == {"P": 4}
    assert (out / "points" / "bench" / "base__medium.json").read_text() == base


def test_points_without_meta_json_are_never_reused_as_finished(tmp_path):
    out = tmp_path / "run"
    exp = load_experiment(str(experiment(tmp_path)))
    finish(open_experiment_run(exp, out, "bench", False, None, backend="emulate"), exp)
    (out / "meta.json").unlink()
    for resume in (False, True):
        with pytest.raises(RunDirError, match="2 measured point.*no meta.json"):
            open_experiment_run(exp, out, "bench", resume, None, backend="emulate")
    run = open_experiment_run(exp, out, "bench", True, None, backend="emulate", remeasure=True)
    assert len(pending_points(run, "bench", exp)) == 2


# ============================================ 2. outputs never destroy what is there
def test_an_output_is_written_only_over_a_regular_file_that_is_not_an_input(tmp_path):
    fifo, fifo_csv = tmp_path / "fifo", tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    os.mkfifo(fifo_csv)
    copy = tmp_path / "x.csv"
    shutil.copy(DETAILS, copy)
    before = copy.read_bytes()
    for args, needle in ((["report", copy, "-o", "/dev/null"], "is a character device"),
                         (["report", copy, "-o", fifo], "is a FIFO"),
                         (["import", copy, "-o", fifo_csv], "is a FIFO"),
                         (["workload", "generate", "medium", "--B", 8, "-o", fifo], "is a FIFO"),
                         (["report", copy, "-o", copy], "is also an input"),
                         (["import", copy, "-o", copy], "is also an input")):
        refused(cli(*args), 2, needle, "choose another -o")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert copy.read_bytes() == before
    run = valid_run(tmp_path)
    meta = (run / "meta.json").read_bytes()
    refused(cli("report", run, "-o", run / "meta.json"), 2, "meta.json: it is also an input")
    assert (run / "meta.json").read_bytes() == meta
    link = tmp_path / "link.txt"   # a symbolic link is followed, as the shell's > does
    link.symlink_to(tmp_path / "target.txt")
    write_atomic(link, "new\n")
    assert link.is_symlink() and (tmp_path / "target.txt").read_text() == "new\n"
    with pytest.raises(OutputError, match="is a directory"):
        write_atomic(tmp_path, "x")


# ============================================ 3. calibrate fits only GPU timings of that GPU
def _timed_run(tmp_path: Path, backend: str, gpu: str | None) -> Path:
    exp = load_experiment(str(experiment(tmp_path)))
    meta = {"experiment": exp.to_dict(), "backend": backend, "gpu": {"name": gpu} if gpu else None}
    run = RunDir.create(tmp_path / f"run-{backend}", meta)
    for v in ("base", "rpf"):
        run.write_point("bench", v, "medium", {"status": "ok", "backend": backend, "gpu": gpu or "cpu",
                                               "summary": [{"mode": "steady", "per_table_us": 9.5, "ci95_us": 0.1}]})
    run.release()
    return run.path


def test_calibrate_refuses_timings_not_measured_on_that_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARACTERIZE_CALIBRATION", str(tmp_path / "calibration"))
    emulated = _timed_run(tmp_path, "emulate", None)
    for args in ([], ["--gpu", "a100-80gb"], ["--gpu", "h100-sxm"]):
        refused(cli("calibrate", emulated, *args), 8, "measured by the CPU emulation", "not on a GPU")
    h100 = _timed_run(tmp_path, "cuda", "NVIDIA H100 80GB HBM3")
    refused(cli("calibrate", h100, "--gpu", "a100-80gb"), 8, "measured on NVIDIA H100 80GB HBM3, not on")
    assert not calibration_path("a100-80gb").exists() and not calibration_path("h100-sxm").exists()


# ============================================ 4. every allocation path is budgeted first
def test_compressed_archives_are_sized_before_they_inflate(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARACTERIZE_MEMORY_BUDGET", "16M")
    bomb = tmp_path / "bomb.npz"   # a 64 MiB member that is not .npy, stored in a few KiB
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("indices.bin", bytes(64 << 20))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(WorkloadError, match=r"member 'indices.bin' is not a \.npy array \(it would inflate to 64"):
        load_trace(bomb)
    plain = tmp_path / "plain.pt"
    torch.save((torch.zeros(8 << 20, dtype=torch.int64), torch.tensor([0, 4]), torch.tensor([[4]])), plain)
    deflated = tmp_path / "deflated.pt"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert deflated.stat().st_size < 1 << 20
    with pytest.raises(Exception, match="would need about 192") as e:   # 3 x 64 MiB, refused before torch.load
        load_trace(deflated)
    assert type(e.value).__name__ == "MemoryBudgetError"
    monkeypatch.delenv("CHARACTERIZE_MEMORY_BUDGET")
    refused(cli("--memory-budget", "1G", "check", "--backend", "emulate", "--E", "1e9"), 2,
            "checking on tables of E=1,000,000,000", "would need about", "more than the budget")


# ============================================ 5. the build cache heals
@pytest.fixture
def tiny_sources(tmp_path, monkeypatch):
    """A one-function kernel source compiled by the host compiler (a real build, in 0.1 s)."""
    src = tmp_path / "kernels"
    src.mkdir()
    (src / "embedding_bag.cu").write_text('extern "C" int chz_answer() { return 42; }\n')
    monkeypatch.setenv("CHARACTERIZE_KERNELS", str(src))
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path / "cache"))
    B.find_host_compiler.cache_clear()
    yield B.BuildSpec("emulate")
    B.find_host_compiler.cache_clear()


def _loads(result: B.BuildResult) -> bool:
    """The library loads and answers, in a process of its own (damaging a library this
    process has mapped would end it with SIGBUS, which is the point of verifying first)."""
    code = f"import ctypes; print(ctypes.CDLL({str(result.library)!r}).chz_answer())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "42"


def test_damaged_cache_entries_are_rebuilt_and_never_loaded(tiny_sources):
    spec = tiny_sources
    first = B.build(spec)
    assert not first.cached and B.build(spec).cached
    entry, whole = first.library.parent, first.library.read_bytes()
    for damage in (lambda: first.library.write_bytes(whole[: len(whole) // 3]),       # truncated (was SIGBUS)
                   lambda: first.library.write_bytes(b""),                             # empty
                   lambda: first.library.write_bytes(whole[:99] + bytes([whole[99] ^ 1]) + whole[100:]),  # a bit
                   lambda: (entry / "build.json").write_text('{"command": [1'),        # torn build.json
                   lambda: first.library.unlink(),                                     # gone
                   lambda: (shutil.rmtree(entry), entry.write_text("junk"))):          # a file in its place
        damage()
        assert not B.is_cached(spec)
        again = B.build(spec)
        assert not again.cached and B.verified_entry(entry) and len(again.library.read_bytes()) == len(whole)
    assert _loads(again)
    meta = json.loads((entry / "build.json").read_text())   # written before sizes were recorded: adopted
    del meta["library"]
    (entry / "build.json").write_text(json.dumps(meta))
    assert B.build(spec).cached and "library" in json.loads((entry / "build.json").read_text())
    (entry / "build.json").write_text(json.dumps(meta))
    first.library.write_bytes(whole[:-4096])   # ... unless its ELF is cut
    assert not B.build(spec).cached


def test_a_build_that_wrote_no_library_is_an_error_and_not_cached(tiny_sources, monkeypatch):
    monkeypatch.setenv("CXX", shutil.which("true"))   # a "compiler" that succeeds and writes nothing
    B.find_host_compiler.cache_clear()
    with pytest.raises(BuildError, match="produced no library"):
        B.build(tiny_sources)
    assert not B.is_cached(tiny_sources)
    assert not [p for p in (Path(os.environ["CHARACTERIZE_CACHE"]) / "build").iterdir()]


# ============================================ 6. file-system errors are one line, exit 12
def _small_files() -> None:
    """In the child: files may not grow past 4 KiB (writes beyond fail with EFBIG, a real
    write error as a full disk gives ENOSPC)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_file_system_errors_name_the_path_and_the_operation(tmp_path):
    exp = experiment(tmp_path)
    refused(cli("bench", exp, "--backend", "emulate", "--out", exp / "run"), 12,
            f"cannot create the run directory {exp / 'run'}", f"{exp} is a file, not a directory")
    long = tmp_path / ("r" * 300)
    refused(cli("bench", exp, "--backend", "emulate", "--out", long), 12, "File name too long (ENAMETOOLONG)")
    (tmp_path / "locked" / ".lock").mkdir(parents=True)
    refused(cli("bench", exp, "--backend", "emulate", "--out", tmp_path / "locked"), 8, ".lock is a directory")
    refused(cli("build", "--arch", "sm_80", "--variants", "base", env={"CHARACTERIZE_CACHE": str(exp)}), 12,
            f"cannot create the directory {exp / 'build'}", "$CHARACTERIZE_CACHE")
    full = program("workload", "presets", stdout=open("/dev/full", "w"))   # noqa: SIM115 - closed with the process
    assert full.returncode == 12
    one_error_line(full.stderr, "cannot write to standard output: No space left on device (ENOSPC)")
    big = subprocess.run([sys.executable, "-m", "characterize.cli", "import", str(DETAILS), "-o", str(tmp_path / "t.csv")],
                         capture_output=True, text=True, timeout=120, preexec_fn=_small_files,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert big.returncode == 12 and not (tmp_path / "t.csv").exists()   # a write cut short leaves nothing behind
    one_error_line(big.stderr, f"cannot write {tmp_path / 't.csv'}: File too large (EFBIG)")
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".t.csv.")]
    e = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.json"))
    assert describe_os_error(e, "write") == (f"cannot write {tmp_path / 'x.json'}: No space left on device (ENOSPC); "
                                             "free space on that file system or write elsewhere")


def test_a_deleted_working_directory_is_one_line(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (f"import os, runpy, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
              "sys.argv = ['characterize', 'workload', 'presets']; runpy.run_module('characterize.cli', "
              "run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.returncode == 12
    one_error_line(r.stderr, "the working directory no longer exists")


@pytest.fixture
def fresh_tool_search():
    """The compiler searches again (they remember what they found, per process)."""
    B.find_nvcc.cache_clear()
    yield
    B.find_nvcc.cache_clear()


@pytest.mark.parametrize("env, needle", [
    ({"CHARACTERIZE_CACHE": "{exp}"}, "static: cannot create the directory"),
    ({"CHARACTERIZE_NVCC": "{tmp}/no-nvcc"}, "static: nvcc: {tmp}/no-nvcc ($CHARACTERIZE_NVCC) does not exist"),
])
def test_run_reports_a_failed_step_and_finishes_the_others(tmp_path, env, needle, fresh_tool_search):
    exp = experiment(tmp_path)
    fill = {"exp": str(exp), "tmp": str(tmp_path)}
    r = cli("run", exp, "--out", tmp_path / "run", env={k: v.format(**fill) for k, v in env.items()})
    refused(r, 9, needle.format(**fill), f"everything else is in {tmp_path / 'run'}")
    steps = load_run(tmp_path / "run").meta["steps"]
    assert steps["static"].startswith("failed: ") and steps["locality"] == "done"
    assert "report: done" in r.output and (tmp_path / "run" / "report.html").is_file()


# ============================================ 7. wrong-typed files and numbers
def test_a_damaged_run_file_costs_its_panel_not_the_report(tmp_path):
    run = valid_run(tmp_path)
    (run / "points" / "bench" / "rpf__medium.json").write_text("[1, 2]")
    text = (run / "locality.json").read_text()
    (run / "locality.json").write_text(text[: len(text) // 2])
    static = pd.read_csv(run / "static.csv").astype({"registers": object})
    static.loc[3, "registers"] = "many"
    static.to_csv(run / "static.csv", index=False)
    r = cli("report", run, "-o", tmp_path / "r.html")
    assert r.exit_code == 0, r.output
    html = (tmp_path / "r.html").read_text()
    assert "locality.json: not valid JSON (torn or cut short?)" in html
    assert "static.csv, line 5: column registers (count) holds" in html
    assert "rpf__medium.json: holds a list where an object is declared" in html   # listed among failures
    assert "Model predictions" in html and "base" in html
    (run / "meta.json").write_text("[]")
    refused(cli("report", run, "-o", tmp_path / "r.html"), 8, "meta.json: holds a list where an object is declared")


@pytest.mark.parametrize("args, code, needle", [
    (["--memory-budget", "1e400", "workload", "stats", "medium"], 2, "beyond any machine's memory"),
    (["workload", "stats", "medium", "--seed", "-1"], 2, "seed must be an integer in 0..2^63-1, got -1"),
    (["build", "--arch", "sm_80", "--maxrregcount", "abc"], 2, "--maxrregcount: 'abc' is not a register cap"),
    (["build", "--arch", "sm_80", "--maxrregcount", "48,0"], 2, "--maxrregcount: '0' is not a register cap"),
    (["e2e", "quick", "--dispatch-us", "nan"], 2, "dispatch_us must be a finite number"),
    (["profile", "quick", "--timeout", "inf", "--ncu", sys.executable], 2, "--timeout must be a positive number"),
])
def test_numbers_out_of_their_domain_are_one_line(args, code, needle):
    refused(cli(*args), code, needle)


@pytest.mark.parametrize("setting, needle", [
    ("budget_s = nan", "bench.budget_s must be a number, got nan; NaN and infinity are not allowed"),
    ("warmup = 1000000000000", "bench.warmup must be an integer in 0..100,000"),
    ("timeout_s = 0.1", "bench.timeout_s must be a finite number above 0.3"),
    ("seed = -3", "seed must be an integer in 0..2^63-1"),
])
def test_experiment_numbers_out_of_their_domain_are_refused(tmp_path, setting, needle):
    p = write_experiment(tmp_path)
    key = setting.split(" =")[0]
    text = p.read_text()
    text = re.sub(rf"(?m)^{key} = .*$", setting, text) if re.search(rf"(?m)^{key} = ", text) else \
        text.replace("[bench]\n", f"[bench]\n{setting}\n")
    p.write_text(text)
    refused(cli("predict", p), 2, needle)


@pytest.mark.parametrize("kernel_id, needle", [("²", "kernel ID '²' is not an ID"),
                                               ("12345678901234567890123", "kernel ID '12345678901234567890123'")])
def test_csv_kernel_ids_that_are_not_ids_are_refused_by_line(tmp_path, kernel_id, needle):
    lines = DETAILS.read_text().splitlines(keepends=True)
    n = next(i for i, ln in enumerate(lines) if ln.startswith('"0",'))
    lines[n] = f'"{kernel_id}",' + lines[n][len('"0",'):]
    p = tmp_path / "ids.csv"
    p.write_text("".join(lines))
    refused(cli("import", p), 7, f"line {n + 1}: {needle}")


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU answer")
def test_check_on_cuda_without_a_gpu_is_no_cuda_device():
    refused(cli("check", "--backend", "cuda", "--variants", "base"), 4, "no CUDA device is visible")


# ============================================ 8. exit codes and hangs
def test_a_point_without_progress_is_stopped_and_a_bench_whose_points_all_failed_exits_13(tmp_path):
    exp = experiment(tmp_path)
    r = program("bench", exp, "--backend", "emulate", "--out", tmp_path / "run", "--timeout", 0.35, "--variants", "base")
    assert r.returncode == 13, r.stderr
    one_error_line(r.stderr, "every one of the 1 of 1 bench point(s) failed", "stopped after 0.35 s",
                   "--resume measures the failed points again")
    assert {p["status"] for p in load_run(tmp_path / "run").points("bench")} == {"failed"}
    assert not [ln for ln in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
                if "characterize.measure.worker" in ln and str(tmp_path) in ln]   # no worker left behind


# ============================================ 9. traces are read as they were written
def test_trace_files_are_read_as_written_or_refused(tmp_path):
    wl = WorkloadConfig(T=1, E=1009, D=8, B=16, L=4, batches=2)
    np.savez(tmp_path / "noidx.npz", offsets=np.arange(33) * 4, lengths=np.full((1, 32), 4))
    with pytest.raises(WorkloadError, match=r"has offsets and lengths but no indices \(keys found: offsets, lengths"):
        load_trace(tmp_path / "noidx.npz", wl)
    np.savez(tmp_path / "few.npz", indices=np.arange(40) % 1009, offsets=np.arange(11) * 4)
    with pytest.raises(WorkloadError, match=r"table 0 holds 10 bags, fewer than one batch of B=16; set B to at most 10"):
        load_trace(tmp_path / "few.npz", wl)
    assert load_trace(tmp_path / "few.npz", wl.replace(B=5)).tables[0].offsets.shape == (2, 5)
    os.mkfifo(tmp_path / "fifo.txt")
    (tmp_path / "dir.npy").mkdir()
    for path, kind in ((tmp_path / "fifo.txt", "a FIFO (named pipe)"), (tmp_path / "dir.npy", "a directory"),
                       (Path("/dev/zero"), "a character device")):
        with pytest.raises(WorkloadError, match=rf"is {kind.replace('(', '.').replace(')', '.')}, not a trace file"):
            load_trace(path, wl)
    exp = write_experiment(tmp_path, datasets=("medium", str(tmp_path / "fifo.txt")))
    refused(cli("predict", exp), 2, "fifo.txt: is a FIFO (named pipe), not a trace file")


# ============================================ 10. the terminal sees text, not commands
def test_text_from_files_is_escaped_before_the_terminal(tmp_path):
    hostile = tmp_path / "hostile.csv"
    hostile.write_text(DETAILS.read_text().replace("nodeByPoint5(", "node\x1b]0;pwned\x07\x1b[2JByPoint5("))
    r = cli("compare", DETAILS, hostile)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output and "node\\x1b]0;pwned\\x07\\x1b[2JByPoint5" in r.output
    named = tmp_path / "two\nlines.csv"
    r = cli("import", named)
    assert r.exit_code != 0 and "\x1b" not in r.output
    one_error_line(r.stderr, "two\\nlines.csv")
    r = cli("report", tmp_path / "gone\n\x1b[2J.csv")   # click's own usage error names it escaped too
    assert r.exit_code == 2 and "\x1b" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")][0].endswith("gone\\n\\x1b[2J.csv' does not exist.")
    refused(cli("compare", DETAILS, hostile, "--pair", "nodeByPoint5=nosuchkernel"), 2,
            "--pair nodeByPoint5=nosuchkernel: no kernel of", "is 'nosuchkernel'")
    refused(cli("report", DETAILS, hostile, "--pair", "nope=nodeByPoint5", "-o", tmp_path / "r.html"), 2,
            "--pair nope=nodeByPoint5: no kernel of")
    text = DETAILS.read_text()
    doubled = tmp_path / "doubled.csv"
    doubled.write_text(text.replace('"Rule Name"', '"Metric Value"', 1))
    refused(cli("import", doubled), 7, "two 'Metric Value' columns (fields 15 and 16)")
    B.find_nvcc.cache_clear()
    try:
        refused(cli("build", "--arch", "sm_80", "--variants", "base", env={"CHARACTERIZE_NVCC": str(tmp_path / "nv")}),
                3, f"nvcc: {tmp_path / 'nv'} ($CHARACTERIZE_NVCC) does not exist")
    finally:
        B.find_nvcc.cache_clear()
