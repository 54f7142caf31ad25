"""Process hygiene (issue 13, case 1 and the build litter of case 10): a worker dies with
its parent, a run directory has one writer at a time, interrupted work leaves no litter.
Everything here uses real processes, real pipes and real flock locks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from characterize import store
from characterize.cli import main
from characterize.errors import RunDirLocked
from characterize.kernels.build import _remove_litter
from characterize.measure.lifeline import EXIT_ORPHANED, whole
from characterize.store import RunDir, RunLock, load_run
from tests.conftest import write_experiment

ROOT = Path(__file__).resolve().parents[2]


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its (new) parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _wait_dead(pid: int, timeout: float) -> float:
    start = time.monotonic()
    while not _dead(pid):
        if time.monotonic() - start > timeout:
            raise AssertionError(f"process {pid} still alive after {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


def _orphan_after_parent_dies(child_code: str, parent_extra: str = "") -> float:
    """Start parent -> child (child runs `child_code` then sleeps), SIGKILL the parent,
    and return how long the child took to die."""
    child = textwrap.dedent(child_code) + "\nimport time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    parent = textwrap.dedent(f"""
        import subprocess, sys, os
        child = subprocess.Popen([sys.executable, "-c", {child!r}], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True{parent_extra})
        print(child.pid, flush=True)
        print(child.stdout.readline().strip(), flush=True)
        import time; time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pid = int(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait()
    return _wait_dead(pid, timeout=5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux only")
def test_the_parent_death_signal_kills_an_orphan():
    took = _orphan_after_parent_dies(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from characterize.measure.lifeline import die_with_parent
        import signal
        assert die_with_parent(signal.SIGKILL, parent=os.getppid())
    """)
    assert took < 1.0


def test_the_pipe_watchdog_ends_an_orphan_without_prctl():
    took = _orphan_after_parent_dies(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from characterize.measure.lifeline import watch_pipe
        watch_pipe(0)
    """)
    assert took < 1.0


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from characterize.measure.lifeline import die_with_parent; " \
           "die_with_parent(parent=1)"  # pid 1 is never our parent here
    assert subprocess.run([sys.executable, "-c", code]).returncode == EXIT_ORPHANED


def _armed_signal(supervisor: str) -> int:
    """The parent-death signal a worker process ends up with after supervise(`supervisor`)."""
    code = textwrap.dedent(f"""
        import ctypes, os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from characterize.measure.lifeline import supervise
        supervise({supervisor})
        sig = ctypes.c_int()
        ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)   # PR_GET_PDEATHSIG
        print(sig.value, flush=True)
    """)
    # stdin is a pipe we hold open, as the runner does (its closing would end the worker)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        return int(proc.stdout.readline())
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_GET_PDEATHSIG) is Linux only")
def test_the_parent_death_signal_is_armed_only_when_the_runner_is_the_direct_parent():
    # the bench worker, started by the runner: armed (SIGTERM)
    assert _armed_signal("os.getppid()") == signal.SIGTERM
    # the profile target, which ncu forks (no --supervisor): nothing armed, ncu's exit is not ours to follow
    assert _armed_signal("None") == 0


def _stop(_signum, _frame):
    raise SystemExit(EXIT_ORPHANED)


def test_a_stop_asked_for_while_a_point_is_recorded_waits_for_its_log_line():
    """The worker records a point and its log line inside whole(): a SIGTERM (its parent's
    death) arriving between the two stops the worker after both, not between them."""
    done = []
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        with pytest.raises(SystemExit) as stopped:
            with whole():
                done.append("point")
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # without whole() the handler raises here
                done.append("log line")
        assert stopped.value.code == EXIT_ORPHANED and done == ["point", "log line"]
        assert signal.getsignal(signal.SIGTERM) is _stop
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_bench_leaves_no_worker_measuring_and_resume_measures_nothing_twice(tmp_path, sig):
    exp = write_experiment(tmp_path, datasets=("medium", "random", "high"))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "characterize.cli", "bench", str(exp), "--backend", "emulate",
                             "--out", str(out)], stderr=subprocess.PIPE, text=True, cwd=ROOT)
    while len(list((out / "points" / "bench").glob("*.json"))) < 2:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)
    workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "characterize.measure.worker"],
                                              capture_output=True, text=True).stdout.split()]
    assert len(workers) == 1
    proc.send_signal(sig)
    proc.wait()
    assert _wait_dead(workers[0], timeout=4) < 4
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM and "terminated by SIGTERM" in proc.stderr.read()
    kept = {p.name: p.read_text() for p in (out / "points" / "bench").glob("*.json")}
    time.sleep(0.5)
    assert {p.name for p in (out / "points" / "bench").glob("*.json")} == set(kept)  # nobody measures any more
    r = subprocess.run([sys.executable, "-m", "characterize.cli", "bench", str(exp), "--backend", "emulate", "--out",
                        str(out), "--resume"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert f"{18 - len(kept)} point(s) to time" in r.stderr
    measured = [line.split("] ", 1)[1].split(":")[0] for line in (out / "log.txt").read_text().splitlines()
                if line.split(" ", 1)[1].startswith("bench [")]
    assert len(measured) == len(set(measured)) == 18  # no point measured twice
    for name, text in kept.items():
        assert (out / "points" / "bench" / name).read_text() == text
    assert not [p.name for p in out.rglob(".*") if p.name not in (".lock",)]  # no temporaries, no .inflight


# ------------------------------------------------------------------- the run lock
def _hold_lock(path: Path) -> subprocess.Popen:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from characterize.store import RunLock; " \
           f"lock = RunLock.acquire({str(path)!r}); print('held', flush=True); import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_gets_a_clear_error_naming_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "LOCK_WAIT_S", 0.2)
    holder = _hold_lock(tmp_path / "run")
    try:
        with pytest.raises(RunDirLocked, match=rf"being written by another process \(pid {holder.pid}: .*kill "
                                               rf"{holder.pid}.*choose another --out"):
            RunDir.create(tmp_path / "run", {"experiment": {"name": "x"}})
        assert not (tmp_path / "run" / "meta.json").exists()  # refused before touching anything
        exp = write_experiment(tmp_path)
        r = CliRunner().invoke(main, ["bench", str(exp), "--backend", "emulate", "--out", str(tmp_path / "run"),
                                      "--resume"])
        assert r.exit_code == 8 and r.stderr.startswith("error: ") and "being written by another" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    run = RunDir.create(tmp_path / "run", {"experiment": {"name": "x"}})  # the kernel dropped the dead holder's lock
    assert json.loads((run.path / ".lock").read_text())["pid"] == os.getpid()
    assert "resumed" not in load_run(run.path).meta


def test_the_lock_is_shared_in_a_process_and_held_by_an_inheriting_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "LOCK_WAIT_S", 0.2)
    first = RunDir.create(tmp_path / "run", {"experiment": {"name": "x"}})
    again = RunDir.create(tmp_path / "run", {"experiment": {"name": "x"}}, resume=True)
    assert again.lock is first.lock  # one process, one lock
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(first.lock.fd,))
    try:
        first.release()  # the supervisor is gone; its worker still holds the inherited lock
        probe = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from characterize import store; " \
                f"store.LOCK_WAIT_S = 0.1; store.RunLock.acquire({str(tmp_path / 'run')!r})"
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert r.returncode == 1 and "RunDirLocked" in r.stderr
    finally:
        worker.kill()
        worker.wait()
    assert RunLock.acquire(tmp_path / "run").fd is not None


# ------------------------------------------------------------------------- litter
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_killed_writer_leaves_no_temporaries_after_the_next_open(tmp_path):
    run = RunDir.create(tmp_path / "run", {"experiment": {"name": "x"}})
    run.write_point("bench", "base", "medium", {"status": "ok"})
    torn = [run.path / "points" / "bench" / ".rpf__medium.json.k2j3x8a_", run.path / ".meta.json.abcdefgh"]
    for t in torn:
        t.write_text("{half")
    keep = run.path / "points" / "bench" / ".inflight"
    keep.write_text("rpf__medium")
    run.release()
    RunDir.create(tmp_path / "run", {}, resume=True)
    assert not any(t.exists() for t in torn) and keep.exists()
    assert load_run(tmp_path / "run").points("bench")[0]["status"] == "ok"


def test_build_folders_of_dead_builders_are_removed(tmp_path):
    key = "0123456789abcdef0123"
    dead = tmp_path / f".{key}-{_dead_pid()}-x1y2z3ab"
    live = tmp_path / f".{key}-{os.getpid()}-q9w8e7r6"
    old_layout = tmp_path / f".{key}-k2j3_a8x"
    foreign = tmp_path / ".not-ours"
    for d in (dead, live, old_layout, foreign):
        d.mkdir()
        (d / "libchz.so").write_bytes(b"half")
    day_ago = time.time() - 2 * 86400
    os.utime(old_layout, (day_ago, day_ago))
    _remove_litter(tmp_path)
    assert not dead.exists() and not old_layout.exists()
    assert live.exists() and foreign.exists()


@pytest.mark.slow
def test_a_build_killed_mid_compile_leaves_no_folder_behind(tmp_path):
    env = dict(os.environ, CHARACTERIZE_CACHE=str(tmp_path / "cache"))
    code = "from characterize.kernels.build import BuildSpec, build; build(BuildSpec('emulate'))"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, start_new_session=True)
    cache = tmp_path / "cache" / "build"
    deadline = time.time() + 60
    while not (cache.is_dir() and list(cache.glob(".*"))):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the builder and its compiler, mid-compile
    proc.wait()
    assert list(cache.glob(".*"))  # the litter a SIGKILL leaves ...
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not list(cache.glob(".*"))  # ... is gone after the next build
    assert len(list(cache.iterdir())) == 1
