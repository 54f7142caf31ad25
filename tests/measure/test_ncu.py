"""Tests of the profile stage's ncu handling: argv, options, locating ncu, failure classification.

No GPU or real ncu is needed: ``run_ncu`` is exercised with tiny shell scripts that
print the texts the real ncu prints (ERR_NVGPUCTRPERM, "No kernels were profiled",
"The application returned an error code (N)").
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from characterize.errors import ConfigError, NcuError, NcuNotFound, NcuPermissionError
from characterize.measure.ncu import (
    CACHE_METRICS,
    METRIC_SETS,
    STALL_REASONS,
    NcuOptions,
    build_argv,
    cache_argv,
    export_path,
    find_ncu,
    ncu_version,
    nvtx_push_pop_filter,
    replay_modes,
    run_ncu,
    stall_metric,
)
from characterize.toolchain import Places

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fake ncu scripts are POSIX shell")

NCU = Path("/opt/nvidia/nsight-compute/2025.3.1/ncu")

# Written out in full on purpose: the test must fail if the default set drifts.
DEFAULT_METRICS = ",".join(
    [
        "gpu__time_duration.sum",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "sm__maximum_warps_per_active_cycle_pct",
        "launch__registers_per_thread",
        "launch__occupancy_limit_blocks",
        "launch__occupancy_limit_registers",
        "launch__occupancy_limit_shared_mem",
        "launch__occupancy_limit_warps",
        "launch__block_size",
        "launch__grid_size",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_misc_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
        "lts__t_sector_hit_rate.pct",
        "l1tex__t_sector_hit_rate.pct",
        "lts__t_bytes.sum",
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpc__cycles_elapsed.avg.per_second",   # the SM clock, in every metric set
        # what the panels read (measure.ncu.PANEL_METRICS)
        "launch__waves_per_multiprocessor",
        "smsp__inst_issued.sum",
        "smsp__inst_executed.sum",
        "sm__inst_executed.avg.per_cycle_active",
        "sm__inst_issued.avg.per_cycle_active",
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
        "l1tex__m_xbar2l1tex_read_bytes.sum",
        "l1tex__m_l1tex2xbar_write_bytes.sum",
        "lts__t_sectors_srcunit_tex_op_read.sum",
        "lts__t_sectors_srcunit_tex_op_write.sum",
        "lts__t_sectors.sum",
        "dram__bytes.sum.per_second",
        "dram__bytes.sum.peak_sustained",
        "dram__cycles_elapsed.avg.per_second",
        "lts__t_bytes.sum.per_second",
        "lts__t_bytes.sum.peak_sustained",
        "lts__cycles_elapsed.avg.per_second",
        "l1tex__t_bytes.sum.per_second",
        "l1tex__t_bytes.sum.peak_sustained",
        "l1tex__cycles_elapsed.avg.per_second",
        "smsp__warps_eligible.avg.per_cycle_active",
        "smsp__issue_active.avg.per_cycle_active",
    ]
)
GMMA = "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio"


def test_every_metric_set_records_the_sm_clock() -> None:
    for name, metric_set in METRIC_SETS.items():
        assert "gpc__cycles_elapsed.avg.per_second" in metric_set.metrics, name

# ---------------------------------------------------------------------------
# argv
# ---------------------------------------------------------------------------


def test_default_argv_is_exact() -> None:
    argv = build_argv(NCU, NcuOptions(), Path("runs/r1/profile"), ["python", "-m", "bench", "--table", "3"])
    assert argv == [
        "/opt/nvidia/nsight-compute/2025.3.1/ncu",
        "--export", "runs/r1/profile.ncu-rep",
        "--force-overwrite",
        "--config-file", "off",
        "--cache-control", "none",
        "--clock-control", "base",
        "--replay-mode", "kernel",
        "--target-processes", "all",
        "--nvtx",
        "--section", "LaunchStats",
        "--section", "Occupancy",
        "--section", "WarpStateStats",
        "--section", "MemoryWorkloadAnalysis",
        "--section", "SpeedOfLight",
        "--metrics", DEFAULT_METRICS,
        "python", "-m", "bench", "--table", "3",
    ]  # fmt: skip


def test_non_default_argv_is_exact() -> None:
    options = NcuOptions(
        metric_set="quick",
        extra_metrics=("sm__cycles_elapsed.avg", "gpu__time_duration.sum"),  # duplicate is dropped
        cache_control="all",
        clock_control="none",
        replay_mode="application",
        nvtx_include=(nvtx_push_pop_filter("chz/base/medium/3"), "regex:chz\\/rpf\\/.*/"),
        launch_count=12,
        kernel_name="embedding_bag_.*",
        target_processes="application-only",
        ignore_config_file=False,
    )
    argv = build_argv(Path("ncu"), options, Path("/tmp/x.ncu-rep"), ("./bench",))
    assert argv == [
        "ncu",
        "--export", "/tmp/x.ncu-rep",
        "--force-overwrite",
        "--cache-control", "all",
        "--clock-control", "none",
        "--replay-mode", "application",
        "--target-processes", "application-only",
        "--nvtx",
        "--nvtx-include", "chz\\/base\\/medium\\/3/",
        "--nvtx-include", "regex:chz\\/rpf\\/.*/",
        "--metrics",
        "gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,"
        "dram__bytes_read.sum,dram__bytes_write.sum,gpc__cycles_elapsed.avg.per_second,sm__cycles_elapsed.avg",
        "--launch-count", "12",
        "-k", "regex:embedding_bag_.*",
        "./bench",
    ]  # fmt: skip


@pytest.mark.parametrize(("sm", "has_gmma"), [(None, False), (80, False), (86, False), (90, True), (100, True)])
def test_hopper_stall_only_requested_on_sm90_and_later(sm: int | None, has_gmma: bool) -> None:
    argv = build_argv(NCU, NcuOptions(sm=sm), Path("p"), ["app"])
    metrics = argv[argv.index("--metrics") + 1].split(",")
    assert (GMMA in metrics) is has_gmma
    assert len(metrics) == len(set(metrics))


def test_default_set_covers_every_stall_reason() -> None:
    default = METRIC_SETS["default"]
    assert set(default.metrics_for(90)) >= {stall_metric(r) for r in STALL_REASONS}
    assert set(STALL_REASONS) >= {"long_scoreboard", "gmma", "selected", "no_instruction"}
    assert len(STALL_REASONS) == 19


@pytest.mark.parametrize(
    ("given", "written"),
    [
        ("a/b", "a/b.ncu-rep"),
        ("a/b.ncu-rep", "a/b.ncu-rep"),
        ("a/b.ncu-repz", "a/b.ncu-repz"),
        ("a/b.v2", "a/b.v2.ncu-rep"),
    ],
)
def test_export_path_always_has_a_report_extension(given: str, written: str) -> None:
    assert export_path(Path(given)) == Path(written)


def test_nvtx_push_pop_filter_escapes_quantifiers() -> None:
    assert nvtx_push_pop_filter("chz/base/medium/3") == "chz\\/base\\/medium\\/3/"
    assert nvtx_push_pop_filter("warmup") == "warmup/"
    assert nvtx_push_pop_filter("a[1]+b*") == "a\\[1\\]\\+b\\*/"
    assert nvtx_push_pop_filter("chz/l2p/hot/0", domain="characterize") == "characterize@chz\\/l2p\\/hot\\/0/"
    with pytest.raises(ConfigError, match="domain separator"):
        nvtx_push_pop_filter("a@b")
    with pytest.raises(ConfigError):
        nvtx_push_pop_filter("")


# ---------------------------------------------------------------------------
# Option validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"metric_set": "everything"}, "unknown ncu metric set"),
        ({"cache_control": "some"}, "cache_control must be one of"),
        ({"clock_control": "boost"}, "clock_control must be one of"),
        ({"replay_mode": "graph"}, "replay_mode must be one of"),
        ({"target_processes": "none"}, "target_processes must be one of"),
        ({"nvtx_include": "chz/base/"}, "nvtx_include must be a tuple"),
        ({"nvtx_include": ("ok/", " ")}, "empty filter"),
        ({"extra_metrics": ("a__b.sum,c__d.sum",)}, "not a metric name"),
        ({"extra_metrics": ["a__b.sum"]}, "extra_metrics must be a tuple"),
        ({"launch_count": 0}, "launch_count must be a positive integer"),
        ({"launch_count": True}, "launch_count must be a positive integer"),
        ({"launch_count": 2.5}, "launch_count must be a positive integer"),
        ({"kernel_name": "embedding_bag("}, "not a valid regular expression"),
        ({"kernel_name": ""}, "kernel_name must be a non-empty"),
        ({"sm": 8}, "sm must be an SM version"),
    ],
)
def test_invalid_options_raise_config_error(fields: dict, message: str) -> None:
    options = NcuOptions(**fields)
    with pytest.raises(ConfigError, match=message):
        options.validate()
    with pytest.raises(ConfigError, match=message):
        build_argv(NCU, options, Path("p"), ["app"])


def test_valid_options_pass_and_options_are_frozen() -> None:
    options = NcuOptions(replay_mode="range", nvtx_include=("chz\\/base\\/medium\\/3/",), launch_count=1, sm=90)
    options.validate()
    with pytest.raises(AttributeError):
        options.cache_control = "all"  # type: ignore[misc]


@pytest.mark.parametrize("target", [[], "python bench.py"])
def test_target_must_be_a_non_empty_argument_list(target: object) -> None:
    with pytest.raises(ConfigError, match="target must be"):
        build_argv(NCU, NcuOptions(), Path("p"), target)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# find_ncu
# ---------------------------------------------------------------------------


def _fake_exe(path: Path, body: str = "exit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture()
def layout(tmp_path: Path) -> dict[str, Path]:
    """One fake ncu in each place find_ncu looks, plus decoys it must skip."""
    return {
        "explicit": _fake_exe(tmp_path / "mine" / "ncu"),
        "path_dir": _fake_exe(tmp_path / "bin" / "ncu").parent,
        "cuda_home": _fake_exe(tmp_path / "cudahome" / "bin" / "ncu").parents[1],
        "nsight": _fake_exe(tmp_path / "nsight" / "2025.10.0" / "ncu").parents[1],
        "cuda_parent": _fake_exe(tmp_path / "local" / "cuda-13.0" / "bin" / "ncu").parents[2],
    }


def _search(layout: dict[str, Path], *skip: str, explicit: Path | None = None) -> Path:
    return find_ncu(explicit, places=Places(
        path="" if "path" in skip else str(layout["path_dir"]),
        cuda_home="" if "cuda_home" in skip else str(layout["cuda_home"]),
        nsight_root=layout["nsight"] / "none" if "nsight" in skip else layout["nsight"],
        cuda_parent=layout["cuda_parent"] / "none" if "cuda_parent" in skip else layout["cuda_parent"],
        wheels=False))


def test_find_ncu_precedence(layout: dict[str, Path]) -> None:
    assert _search(layout, explicit=layout["explicit"]) == layout["explicit"]
    assert _search(layout) == layout["path_dir"] / "ncu"
    assert _search(layout, "path") == layout["cuda_home"] / "bin" / "ncu"
    assert _search(layout, "path", "cuda_home") == layout["nsight"] / "2025.10.0" / "ncu"
    assert _search(layout, "path", "cuda_home", "nsight") == layout["cuda_parent"] / "cuda-13.0" / "bin" / "ncu"


def test_find_ncu_picks_newest_nsight_and_skips_non_executables(tmp_path: Path) -> None:
    root = tmp_path / "nsight"
    for version in ("2024.1.0", "2025.3.1", "2025.10.0"):
        _fake_exe(root / version / "ncu")
    newest_broken = root / "2026.1.0" / "ncu"
    newest_broken.parent.mkdir()
    newest_broken.write_text("not executable")
    found = find_ncu(places=Places(path="", cuda_home="", nsight_root=root, cuda_parent=tmp_path / "none",
                                   wheels=False))
    assert found == root / "2025.10.0" / "ncu"


def test_find_ncu_prefers_plain_cuda_link_then_newest_toolkit(tmp_path: Path) -> None:
    parent = tmp_path / "local"
    _fake_exe(parent / "cuda-12.4" / "bin" / "ncu")
    _fake_exe(parent / "cuda-13.0" / "bin" / "ncu")
    places = Places(path="", cuda_home="", nsight_root=tmp_path / "none", cuda_parent=parent, wheels=False)
    assert find_ncu(places=places) == parent / "cuda-13.0" / "bin" / "ncu"
    _fake_exe(parent / "cuda" / "bin" / "ncu")
    assert find_ncu(places=places) == parent / "cuda" / "bin" / "ncu"


def test_find_ncu_reads_environment_by_default(layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setenv("CUDA_HOME", str(layout["cuda_home"]))
    found = find_ncu(places=Places(nsight_root=layout["nsight"] / "none", cuda_parent=layout["cuda_parent"] / "none",
                                   wheels=False))
    assert found == layout["cuda_home"] / "bin" / "ncu"


def test_find_ncu_not_found_names_places_and_remedy(tmp_path: Path) -> None:
    with pytest.raises(NcuNotFound) as info:
        find_ncu(places=Places(path="", cuda_home="", nsight_root=tmp_path / "opt", cuda_parent=tmp_path / "usr",
                               wheels=False))
    message = str(info.value)
    assert "PATH" in message and str(tmp_path / "opt") in message and str(tmp_path / "usr") in message
    assert "Install Nsight Compute" in message and "--ncu PATH" in message


def test_find_ncu_explicit_must_exist_and_be_executable(tmp_path: Path) -> None:
    with pytest.raises(NcuNotFound, match="does not exist"):
        find_ncu(tmp_path / "nope" / "ncu")
    plain = tmp_path / "ncu"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    with pytest.raises(NcuNotFound, match="not an executable"):
        find_ncu(plain)


def test_ncu_version_parses_banner(tmp_path: Path) -> None:
    fake = _fake_exe(
        tmp_path / "ncu",
        'echo "NVIDIA (R) Nsight Compute Command Line Profiler"\n'
        'echo "Copyright (c) 2018-2025 NVIDIA Corporation"\n'
        'echo "Version 2025.3.1.0 (build 36398880) (public-release)"\n',
    )
    assert ncu_version(fake) == "2025.3.1.0"
    bad = _fake_exe(tmp_path / "other", 'echo "usage: other"\nexit 2\n')
    with pytest.raises(NcuError, match="gave no version"):
        ncu_version(bad)
    with pytest.raises(NcuNotFound):
        ncu_version(tmp_path / "missing")


# ---------------------------------------------------------------------------
# run_ncu failure classification
# ---------------------------------------------------------------------------

CONNECT = '==PROF== Connected to process 4242 (/usr/bin/python3.11)'
DISCONNECT = '==PROF== Disconnected from process 4242'
PERM = (
    "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters "
    "on the target device 0. For instructions on enabling permissions and to get more information see "
    "https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)


def _script(tmp_path: Path, lines: list[str], code: int, *, stderr: list[str] = ()) -> Path:
    body = "".join(f"echo '{line}'\n" for line in lines)
    body += "".join(f"echo '{line}' 1>&2\n" for line in stderr)
    return _fake_exe(tmp_path / "ncu", body + f"exit {code}\n")


def test_success_returns_output_and_tees_log(tmp_path: Path) -> None:
    fake = _script(
        tmp_path,
        [CONNECT, "bench: table 3 done", '==PROF== Profiling "embedding_bag_kernel" - 0: 0%....50%....100% - 9 passes'],
        0,
        stderr=[DISCONNECT, "==PROF== Report: /tmp/r.ncu-rep"],
    )
    log = tmp_path / "logs" / "ncu.log"
    done = run_ncu([fake, "--export", "r"], log)
    assert done.returncode == 0
    assert "embedding_bag_kernel" in done.stdout and "Report: /tmp/r.ncu-rep" in done.stdout
    text = log.read_text()
    assert text.startswith(f"$ {fake} --export r\n")
    assert "bench: table 3 done" in text and DISCONNECT in text


@pytest.mark.parametrize("code", [0, 1])
def test_permission_error_is_classified_whatever_the_exit_code(tmp_path: Path, code: int) -> None:
    fake = _script(tmp_path, [CONNECT, PERM, DISCONNECT, "==WARNING== No kernels were profiled."], code)
    log = tmp_path / "ncu.log"
    with pytest.raises(NcuPermissionError) as info:
        run_ncu([fake], log)
    message = str(info.value)
    assert "NVreg_RestrictProfilingToAdminUsers=0" in message and "/etc/modprobe.d" in message
    assert "sudo" in message and "ERR_NVGPUCTRPERM" in message and str(log) in message
    assert info.value.reason == "permission" and info.value.log_path == log and info.value.returncode == code


def test_no_kernels_profiled_suggests_the_filters(tmp_path: Path) -> None:
    fake = _script(tmp_path, [CONNECT, "bench done", DISCONNECT, "==WARNING== No kernels were profiled."], 0)
    argv = [fake, "--nvtx", "--nvtx-include", "chz\\/base\\/medium\\/3/", "--launch-count", "4", "app"]
    with pytest.raises(NcuError) as info:
        run_ncu(argv, tmp_path / "ncu.log")
    assert not isinstance(info.value, NcuPermissionError)
    message = str(info.value)
    assert info.value.reason == "no_kernels"
    assert "--nvtx-include chz\\/base\\/medium\\/3/" in message and "--launch-count 4" in message
    assert "NVTX filter" in message


def test_failing_target_program_is_distinguishable(tmp_path: Path) -> None:
    fake = _script(
        tmp_path,
        [
            CONNECT,
            "Traceback (most recent call last):",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            DISCONNECT,
            "==ERROR== The application returned an error code (3).",
            "==WARNING== No kernels were profiled.",
        ],
        3,
    )
    with pytest.raises(NcuError) as info:
        run_ncu([fake], tmp_path / "ncu.log")
    err = info.value
    assert err.reason == "target_failed" and err.target_returncode == 3 and err.returncode == 3
    assert "exited with code 3" in str(err) and "application returned an error code (3)" in str(err)
    assert str(tmp_path / "ncu.log") in str(err)


def test_other_ncu_error_carries_last_error_lines_and_log(tmp_path: Path) -> None:
    fake = _script(
        tmp_path,
        [CONNECT, "==ERROR== Failed to find metric regex:^smsp__bogus(\\.(sum|avg))?$", DISCONNECT],
        1,
    )
    with pytest.raises(NcuError) as info:
        run_ncu([fake], tmp_path / "ncu.log")
    err = info.value
    assert err.reason == "ncu_failed" and err.target_returncode is None and err.returncode == 1
    assert "Failed to find metric" in str(err) and str(tmp_path / "ncu.log") in str(err)


def test_nonzero_exit_without_error_lines_is_an_error(tmp_path: Path) -> None:
    fake = _script(tmp_path, ["==PROF== something odd"], 7)
    with pytest.raises(NcuError, match="exit code 7") as info:
        run_ncu([fake], tmp_path / "ncu.log")
    assert info.value.reason == "ncu_failed"


def test_timeout_kills_ncu_and_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    fake = _fake_exe(tmp_path / "ncu", f"echo started\nsleep 30 &\necho $! > {pid_file}\nwait\n")
    start = time.monotonic()
    with pytest.raises(NcuError, match="did not finish within 0.5 s") as info:
        run_ncu([fake], tmp_path / "ncu.log", timeout=0.5)
    assert time.monotonic() - start < 10
    assert info.value.reason == "timeout" and "started" in info.value.output
    child = int(pid_file.read_text())
    for _ in range(100):  # the kill is asynchronous; give the kernel a moment
        if not _alive(child):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the profiled child process survived the timeout")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a killed child waiting to be reaped (zombie) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat_file = Path(f"/proc/{pid}/stat")
    if stat_file.exists():
        try:
            return stat_file.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    return True


def test_env_is_passed_to_ncu(tmp_path: Path) -> None:
    fake = _fake_exe(tmp_path / "ncu", 'echo "table=$CHZ_TABLE"\n')
    done = run_ncu([fake], tmp_path / "ncu.log", env={"CHZ_TABLE": "7", "PATH": os.environ.get("PATH", "")})
    assert "table=7" in done.stdout


def test_missing_ncu_executable_raises_not_found(tmp_path: Path) -> None:
    with pytest.raises(NcuNotFound):
        run_ncu([tmp_path / "no-ncu"], tmp_path / "ncu.log")


# ---------------------------------------------------------------------------
# the cache collection (application replay)
# ---------------------------------------------------------------------------


def test_cache_collection_argv_is_exact() -> None:
    options = NcuOptions(nvtx_include=("chz-profile/",), kernel_name="chz_|EmbeddingBag", sm=90)
    main_argv = build_argv(NCU, options, Path("runs/r1/ncu/base__medium"), ["python", "-m", "w", "profile"])
    argv = cache_argv(main_argv, Path("runs/r1/ncu/base__medium.cache"))
    assert argv == [
        "/opt/nvidia/nsight-compute/2025.3.1/ncu",
        "--export", "runs/r1/ncu/base__medium.cache.ncu-rep",
        "--force-overwrite",
        "--config-file", "off",
        "--cache-control", "none",
        "--clock-control", "base",
        "--replay-mode", "application",
        "--target-processes", "all",
        "--nvtx",
        "--nvtx-include", "chz-profile/",
        "--metrics", "lts__t_sector_hit_rate.pct,lts__t_sectors.sum,lts__t_bytes.sum,dram__bytes_read.sum,"
                     "dram__bytes_write.sum",
        "-k", "regex:chz_|EmbeddingBag",
        "python", "-m", "w", "profile",
    ]  # fmt: skip


def test_cache_collection_keeps_launch_order_scoping() -> None:
    main_argv = build_argv(NCU, NcuOptions(kernel_name="chz_"), Path("x"), ["t"])
    k = main_argv.index("-k")
    main_argv[k:k] = ["--launch-skip", "24", "--launch-count", "4"]
    argv = cache_argv(main_argv, Path("x.cache"))
    assert argv[argv.index("--metrics") + 2:] == ["--launch-skip", "24", "--launch-count", "4", "-k", "regex:chz_", "t"]
    assert "--section" not in argv and argv[argv.index("--replay-mode") + 1] == "application"


def test_replay_mode_is_recorded_per_metric() -> None:
    modes = replay_modes(NcuOptions())
    assert modes["default"] == "kernel" and modes["lts__t_sector_hit_rate.pct"] == "application"
    assert set(CACHE_METRICS) < set(modes) and set(CACHE_METRICS) <= set(METRIC_SETS["cache"].metrics)
    assert all(m == "kernel" for m in replay_modes(NcuOptions(), cache_collected=False).values())
    with pytest.raises(ConfigError):
        cache_argv(["ncu", "target"], Path("x"))


# ---------------------------------------------------------------------------
# the default set against what the panels read, and against a real GPU's metric list
# ---------------------------------------------------------------------------

H200 = Path(__file__).resolve().parents[2] / "profiles" / "h200"


def test_the_default_set_collects_every_counter_a_panel_reads() -> None:
    """Every column the report's Nsight Compute panels read (analysis.ncu.PANEL_COLUMNS) comes
    from a metric the default set asks for by name, or from one its sections put in a report:
    what a real H200 report collected with the default sections holds (profiles/h200, the
    first run's base profile)."""
    from characterize.analysis.ncu import PANEL_COLUMNS, RAW
    from characterize.extract.ncu_rep import read_report

    asked = set(METRIC_SETS["default"].metrics_for(90))
    sections = set(read_report(H200 / "paper-gpu" / "ncu" / "base.ncu-rep")["metric"])
    missing = [c for c in PANEL_COLUMNS if not set(RAW[c]) & (asked | sections)]
    assert not missing, f"panels read counters the default profile does not collect: {missing}"


def test_every_requested_metric_exists_on_hopper() -> None:
    """Each metric of every set is a counter of the GH100 metric list ncu printed on the H200
    (ncu --query-metrics --chip gh100; by its base name, before the roll-up), or a metric a
    real H200 report holds (the sections' derived metrics such as theoretical occupancy);
    launch attributes are not counters. A name ncu does not know aborts a whole profile."""
    import gzip

    from characterize.extract.ncu_rep import read_report

    listed = {line.split()[0] for line in gzip.open(H200 / "ncu-probe" / "metrics-gh100.txt.gz", "rt")
              if line.strip() and not line.startswith(("-", " ", "Chip", "Metric", "=="))}
    seen = set(read_report(H200 / "ncu-probe" / "panels.ncu-rep")["metric"])
    for name, metric_set in METRIC_SETS.items():
        for metric in metric_set.metrics_for(90):
            if metric.startswith("launch__"):
                continue
            assert metric.split(".")[0] in listed or metric in seen, (name, metric)
    assert "l1tex__t_bytes" in listed and "sm__maximum_warps_per_active_cycle_pct" not in listed
