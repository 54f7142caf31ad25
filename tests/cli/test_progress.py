"""Progress and terminal output: bars on a terminal only, one line per step otherwise,
honest build-cache counts, and tables that format percentages and integers."""

import dataclasses
import math
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from characterize.cli import main
from characterize.cli.base import TerminalReporter, format_table
from characterize.kernels.build import BuildSpec, BuildTally, build_many
from characterize.progress import Lines, Quiet, as_reporter
from tests.analysis.test_model import sass, static

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

#: a reporter with one step of three units, as the pipeline drives it
SCRIPT = textwrap.dedent("""
    import time
    from characterize.cli.base import TerminalReporter
    with TerminalReporter() as rep:
        rep.message("starting")
        with rep.task("compile", unit="builds") as t:
            for i in range(3):
                t.grow(1)
            for i in range(3):
                time.sleep(0.15)
                t.advance(1, item=f"build {i}")
            t.finish("3 build(s): 2 compiled, 1 reused from the cache")
""")


def _in_pty(code: str) -> str:
    """Run `code` with stdout and stderr on a pseudo-terminal; everything it wrote."""
    leader, follower = pty.openpty()
    env = dict(os.environ, TERM="xterm", COLUMNS="100")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=follower, stdout=follower, stderr=follower,
                            cwd=ROOT, env=env, close_fds=True)
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=30)
    os.close(leader)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_a_terminal_gets_a_bar_then_the_step_line():
    out = _in_pty(SCRIPT)
    assert "━" in out and ANSI.search(out)                      # a bar was drawn
    assert re.search(r"[0-3]/3 builds", out) and "build 1" in out  # with counts and the current item
    plain = ANSI.sub("", out)
    assert re.search(r"compile: 3 build\(s\): 2 compiled, 1 reused from the cache \(\d+\.\d s\)", plain)
    assert "starting" in plain


def test_without_a_terminal_one_plain_line_per_step():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, TERM="xterm"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "  starting"
    assert re.fullmatch(r"  compile: 3 build\(s\): 2 compiled, 1 reused from the cache \(\d+\.\d s\)", lines[1])
    assert len(lines) == 2 and not ANSI.search(proc.stderr) and "━" not in proc.stderr and proc.stdout == ""


def test_a_long_step_without_a_terminal_says_where_it_is_now_and_then(capsys, monkeypatch):
    from characterize.cli import base

    monkeypatch.setattr(base._PlainTask, "PLAIN_EVERY_S", 0.0)
    with TerminalReporter(bars=False) as rep, rep.task("compile", unit="builds") as t:
        t.grow(2)
        t.advance(1, item="sm_80: compiled in 21 s")
        t.advance(0, item="only a new item")   # nothing finished: nothing said
        t.advance(1)
        t.finish("2 build(s): 2 compiled, 0 reused from the cache")
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["  compile: 1/2 builds (sm_80: compiled in 21 s) ...", "  compile: 2/2 builds ..."]
    assert len(lines) == 3 and lines[2].startswith("  compile: 2 build(s): 2 compiled")
    monkeypatch.setattr(base._PlainTask, "PLAIN_EVERY_S", 3600.0)
    with TerminalReporter(bars=False) as rep, rep.task("quick", 5) as t:
        t.advance(5)
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_clirunner_is_not_a_terminal_and_json_stays_clean(tmp_path):
    trace = tmp_path / "t.txt"
    trace.write_text("\n".join(str(i % 7) for i in range(50)) + "\n")
    r = CliRunner().invoke(main, ["workload", "stats", str(trace), "--json"])
    assert r.exit_code == 0, r.output
    assert r.output.lstrip().startswith("{") and not ANSI.search(r.output) and "━" not in r.output


def test_reporter_quiet_and_summaries_off(capsys):
    with TerminalReporter(quiet=True) as rep, rep.task("x", 2) as t:
        t.advance(2)
        t.finish("two")
    rep.message("not shown")
    with TerminalReporter(summaries=False, bars=False) as rep, rep.task("y") as t:
        t.finish("one")
    assert capsys.readouterr().err == ""


def test_library_reporters_take_callbacks_or_nothing():
    said = []
    rep = as_reporter(said.append)
    assert isinstance(rep, Lines) and isinstance(as_reporter(None), Quiet)
    with rep.task("locality", total=2) as t:
        t.advance(2)
        t.finish("2 dataset(s) analyzed")
    rep.message("report written")
    assert re.fullmatch(r"locality: 2 dataset\(s\) analyzed \(\d+\.\d s\)", said[0]) and said[1] == "report written"
    with Quiet().task("anything") as t:  # the default says nothing and accepts everything
        t.grow(3)
        t.advance(1, item="a")
        t.finish("b")


def _tiny_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel directory whose 'family' compiles for the host in a fraction of a second,
    and an empty build cache: the real build and cache code, without nvcc's minutes."""
    src = tmp_path / "kernels"
    src.mkdir()
    (src / "embedding_bag.cu").write_text('extern "C" int chz_probe(void) { return 7; }\n')
    monkeypatch.setenv("CHARACTERIZE_KERNELS", str(src))
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path / "cache"))


def test_build_counts_say_compiled_on_a_cold_cache_and_reused_on_a_warm_one(tmp_path, monkeypatch):
    _tiny_kernels(tmp_path, monkeypatch)
    specs = [BuildSpec("emulate", dtype="fp32"), BuildSpec("emulate", dtype="fp16")]
    events = []
    cold = BuildTally()
    build_many(specs + specs[:1], observer=lambda e: (events.append(e), cold(e)))
    assert [(e.stage, e.cached) for e in events if e.stage == "planned"] == [("planned", False)] * 2
    assert sorted(e.spec.dtype for e in events if e.stage == "done") == ["fp16", "fp32"]
    assert all(e.seconds > 0 for e in events if e.stage == "done")
    assert (cold.compiled, cold.reused) == (2, 0)
    assert cold.summary() == "2 build(s): 2 compiled, 0 reused from the cache"
    warm = BuildTally()
    build_many(specs, observer=warm)
    build_many(specs[:1], observer=warm)   # asked for again by another caller: counted once
    assert (warm.compiled, warm.reused) == (0, 2)
    assert warm.summary() == "2 build(s): 0 compiled, 2 reused from the cache"


def test_a_step_task_follows_every_build(tmp_path, monkeypatch):
    _tiny_kernels(tmp_path, monkeypatch)

    class Recorder:
        def __init__(self):
            self.total, self.done, self.items = 0, 0, []

        def grow(self, n=1):
            self.total += n

        def advance(self, n=1, item=""):
            self.done += n
            self.items.append(item)

        def finish(self, summary):
            self.summary = summary

    task = Recorder()
    tally = BuildTally.advancing(task)
    build_many([BuildSpec("emulate", dtype="bf16")], observer=tally)
    build_many([BuildSpec("emulate", dtype="bf16"), BuildSpec("emulate", dtype="int8")], observer=tally)
    assert (task.total, task.done) == (0, 2)   # counted as they come; no total is promised
    assert any("compiled in" in i for i in task.items) and tally.summary().startswith("2 build(s): 2 compiled")


# ------------------------------------------------------------------ tables
def _cells(lines: list[str]) -> list[list[str]]:
    return [ln.split() for ln in lines[2:]]


def test_tables_format_percentages_integers_and_decimals_per_column():
    rows = [{"variant": "base", "registers": 54.0, "occupancy_pct": 50.0, "speedup": 1.0, "GBps": 0.01391,
             "lookups": 307200, "hit": 0.881, "note": None},
            {"variant": "warp", "registers": 64.0, "occupancy_pct": 37.5, "speedup": 0.38313, "GBps": 0.005329,
             "lookups": 1234567, "hit": math.nan, "note": "x"}]
    lines = format_table(rows, fractions=["hit"])
    assert _cells(lines) == [["base", "54", "50.0%", "1.000", "0.01391", "307,200", "88.1%"],
                             ["warp", "64", "37.5%", "0.383", "0.00533", "1,234,567", "x"]]
    widths = {len(ln) for ln in lines[2:]}
    assert len(lines[0]) >= max(widths)
    # numbers are right-aligned: their last characters share a column
    end = lines[0].index("lookups") + len("lookups")
    assert lines[2][:end].endswith("307,200") and lines[3][:end].endswith("1,234,567")


def test_tables_handle_text_bools_blanks_and_nothing():
    assert format_table([]) == ["(nothing)"]
    lines = format_table([{"a": True, "b": "", "c": None}, {"a": False, "b": "y", "c": math.nan}])
    assert lines[2].split() == ["True"] and lines[3].split() == ["False", "y"]
    big = format_table([{"t": 12345.678}, {"t": 2500.25}])
    assert _cells(big) == [["12,346"], ["2,500"]]
    # an error beside a failure is not rounded to 0.000, nor written in scientific notation
    err = format_table([{"max_abs_err": 3.869}, {"max_abs_err": 2.708e-06}, {"max_abs_err": 0.0}])
    assert _cells(err) == [["3.869"], ["0.000002708"], ["0"]]
    huge = format_table([{"delta": -6.995e9 + 0.5}, {"delta": 1.5}])
    assert "e+" not in "".join(huge) and _cells(huge)[0] == ["-6,995,000,000"]


def test_tables_write_bytes_in_binary_units_and_fit_the_terminal():
    rows = [{"variant": "base", "dataset": "medium", "dram_bytes": 43e6, "time_us": 12.5, "note": "x" * 40},
            {"variant": "warp", "dataset": "low", "dram_bytes": 512.0, "time_us": 8.25, "note": ""}]
    full = format_table(rows)
    assert _cells(full)[0][:4] == ["base", "medium", "41.0", "MiB"] and "512 B" in full[3]
    fit = format_table(rows, width=40)
    assert all(len(ln) <= 40 for ln in fit[:-1])
    assert fit[0].split() == ["variant", "dataset", "dram_bytes", "time_us"]
    assert fit[-1] == "(1 more column(s) not shown to fit 40 characters: note; --wide shows every column)"
    assert format_table(rows, width=5)[0].split() == ["variant", "dataset"]   # the first two always stay


# ------------------------------------------------------------ pipeline steps
class _Recorder:
    """A Reporter that keeps every task's title, total, progress and summary."""

    def __init__(self):
        self.tasks, self.messages = [], []

    def message(self, text):
        self.messages.append(text)

    def task(self, title, total=None, unit=""):
        import contextlib

        rec = {"title": title, "total": total, "done": 0, "items": [], "summary": None}
        self.tasks.append(rec)

        class T:
            def grow(self, n=1):
                rec["total"] = (rec["total"] or 0) + n

            def advance(self, n=1, item=""):
                rec["done"] += n
                rec["items"].append(item)

            def finish(self, summary):
                rec["summary"] = summary

        @contextlib.contextmanager
        def cm():
            yield T()

        return cm()


def test_the_locality_step_counts_datasets_and_failures(tmp_path, monkeypatch):
    from characterize import pipeline
    from characterize.errors import WorkloadError
    from tests.conftest import write_experiment

    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path / "cache"))   # computed, not kept by another test
    bad = tmp_path / "bad.txt"
    bad.write_text("3\nthree\n")
    exp = pipeline.load_experiment(str(write_experiment(tmp_path, datasets=("medium", str(bad), "random"))))
    run = pipeline.open_experiment_run(exp, tmp_path / "run", "bench", False, None)
    rec = _Recorder()
    with pytest.raises(WorkloadError, match="line 2"):
        pipeline.locality_step(run, exp, rec)
    (task,) = rec.tasks
    assert task["title"] == "locality" and task["total"] == 3 and task["done"] == 3
    assert task["summary"] == "2 dataset(s) analyzed, 1 failed"
    assert any(i.startswith("medium: ") and "unique of" in i for i in task["items"])


def test_the_locality_step_keeps_each_traces_statistics(tmp_path, monkeypatch):
    """A second run reads the statistics back (the same numbers), a trace file rewritten is
    analyzed again, and a damaged entry is worked out again."""
    from characterize import pipeline
    from tests.conftest import write_experiment

    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path / "cache"))
    trace = tmp_path / "trace.txt"
    trace.write_text("\n".join(str(i % 7) for i in range(300)) + "\n")
    exp = pipeline.load_experiment(str(write_experiment(tmp_path, datasets=("medium", str(trace)))))

    def step(name: str) -> tuple[dict, list[str]]:
        rec = _Recorder()
        out = pipeline.locality_step(pipeline.open_experiment_run(exp, tmp_path / name, "bench", False, None), exp,
                                     rec)
        return out, rec.tasks[0]["items"]

    first, items = step("a")
    assert not any("kept from an earlier run" in i for i in items)
    again, items = step("b")
    assert again == first and sum("kept from an earlier run" in i for i in items) == 2
    assert (tmp_path / "a" / "locality.json").read_bytes() == (tmp_path / "b" / "locality.json").read_bytes()
    trace.write_text("\n".join(str(i % 5) for i in range(300)) + "\n")   # another trace under the same name
    os.utime(trace, ns=(1, 1))
    changed, items = step("c")
    assert sum("kept from an earlier run" in i for i in items) == 1 and changed[str(trace)] != first[str(trace)]
    for f in (tmp_path / "cache" / "locality").glob("*.json"):
        f.write_text("{torn")
    fresh, items = step("d")
    assert fresh == changed and not any("kept from an earlier run" in i for i in items)


def test_predictions_advance_once_per_dataset(monkeypatch, tmp_path):
    """Computed (an empty build cache: not predictions another test kept), one step per dataset."""
    from characterize import pipeline

    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path))

    exp = pipeline.load_experiment("quick")
    code = pipeline.CodeFacts(exp.workload.D, static(), sass())   # the committed run's real facts
    rec = _Recorder()
    df = pipeline.predict(exp, ["sm_80"], code=code, progress=rec)
    (task,) = rec.tasks
    assert task["total"] == len(exp.datasets) == task["done"]
    assert task["summary"] == f"{len(df)} point(s) predicted"


def test_a_folded_step_is_one_task_and_keeps_its_parts(tmp_path, monkeypatch):
    """Each precision's builds and predictions move one bar and end in one line; their own
    summaries are kept for the run's log; an enclosing tally sees the parts' builds."""
    from characterize.kernels.build import observe_builds, reported_builds
    from characterize.progress import folded

    _tiny_kernels(tmp_path, monkeypatch)
    rec = _Recorder()
    outer = BuildTally()
    with folded(rec, "static (fp32, fp16)", unit="builds") as fold, observe_builds(outer):
        for dt in ("fp32", "fp16"):
            with reported_builds(fold, f"{dt}: compile"):
                build_many([BuildSpec("emulate", dtype=dt)])
        with fold.task("fp32: predictions", total=3) as t:
            t.advance(3, item="medium")
            t.finish("3 point(s) predicted")
        fold.step.finish(outer.summary())
    (task,) = rec.tasks
    assert task["title"] == "static (fp32, fp16)" and task["done"] == 5 and task["total"] == 3
    assert task["summary"] == "2 build(s): 2 compiled, 0 reused from the cache"
    assert fold.parts == ["fp32: compile: 1 build(s): 1 compiled, 0 reused from the cache",
                          "fp16: compile: 1 build(s): 1 compiled, 0 reused from the cache",
                          "fp32: predictions: 3 point(s) predicted"]
    assert any(i.startswith("fp16: compile: ") for i in task["items"])


def test_predict_step_answers_at_the_workload_dtype_alone(tmp_path, monkeypatch):
    """The first answer waits for no other precision: they are the sweeps step's, after it."""
    from characterize import pipeline
    from characterize.store import load_run

    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path / "cache"))
    committed = load_run(Path(__file__).resolve().parents[2] / "profiles" / "static-paper")
    exp = dataclasses.replace(pipeline.load_experiment("quick"), datasets=("high",), dtypes=("fp32", "fp16"),
                              variants=("base", "warp"))
    run = pipeline.open_experiment_run(exp, tmp_path / "run", "bench", False, None)
    rec = _Recorder()
    df = pipeline.predict_step(run, exp, pipeline.CodeFacts(exp.workload.D, committed.static, committed.sass), rec)
    (task,) = rec.tasks
    assert task["title"].startswith(f"predict ({exp.workload.dtype} on ")
    assert re.fullmatch(r"\d+ point\(s\); the paper's 4 claim\(s\) checked against the model", task["summary"])
    assert set(df["dtype"]) == {exp.workload.dtype}
    log = (tmp_path / "run" / "log.txt").read_text()
    assert f"predict: {exp.workload.dtype} predictions for " in log and "fp16 predictions" not in log