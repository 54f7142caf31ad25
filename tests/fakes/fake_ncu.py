#!/usr/bin/env python3
"""A stand-in for Nsight Compute's `ncu`, for orchestration tests on machines without a GPU.

It parses the command line the way ncu does (options, then the target program),
appends it to $FAKE_NCU_LOG, runs the target on the CPU backend, checks that the
target pushed the NVTX range the --nvtx-include filter selects, and writes a real
.ncu-rep (a copy of $FAKE_NCU_REPORT, a report recorded on a real GPU) to --export.
$FAKE_NCU_MODE selects a failure: perm (ERR_NVGPUCTRPERM), badmetric, nokernels, crash, hang.
Real ncu output lines are reproduced so the caller's log parsing is exercised.
"""

import json
import os
import shutil
import subprocess
import sys
import time

CACHE_ONLY = {"lts__t_sector_hit_rate.pct", "lts__t_sectors.sum", "lts__t_bytes.sum", "dram__bytes_read.sum",
              "dram__bytes_write.sum"}
VALUE_OPTIONS = {"--export", "-o", "--config-file", "--cache-control", "--clock-control", "--replay-mode",
                 "--target-processes", "--nvtx-include", "--nvtx-exclude", "--section", "--metrics",
                 "--launch-count", "-c", "--launch-skip", "-s", "-k", "--kernel-name", "--set"}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2025 NVIDIA Corporation\n"
              "Version 2025.3.1.0 (build 36398880) (public-release)")
        return 0
    opts: dict[str, list] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in VALUE_OPTIONS:
            opts.setdefault(argv[i], []).append(argv[i + 1])
            i += 2
        else:
            opts.setdefault(argv[i], []).append(True)
            i += 1
    target = argv[i:]
    with open(os.environ["FAKE_NCU_LOG"], "a") as f:
        f.write(json.dumps(argv) + "\n")
    mode = os.environ.get("FAKE_NCU_MODE", "ok")
    if mode == "badmetric":
        print("==ERROR== Failed to find metric sm__no_such_counter.sum")
        return 1
    if mode == "perm":
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
              "Counters on the target device 0. For instructions on enabling permissions and to get more "
              "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM")
        return 1
    print(f"==PROF== Connected to process {os.getpid()} ({target[0]})", flush=True)
    env = dict(os.environ, CHARACTERIZE_BACKEND="emulate")
    proc = subprocess.run(target, capture_output=True, text=True, env=env)
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr)
    if proc.returncode != 0:
        print(f"==ERROR== The application returned an error code ({proc.returncode}).")
        return proc.returncode
    pushed = [line.split(" ", 2)[2] for line in proc.stdout.splitlines() if line.startswith("NVTX push ")]
    wanted = [f.rstrip("/") for f in opts.get("--nvtx-include", [])]
    selected = any(w in pushed for w in wanted) if wanted else bool(opts.get("--launch-skip"))
    if mode == "nokernels" or (mode == "nvtx-mismatch" and wanted) or not selected:
        print("==WARNING== No kernels were profiled.")
        return 0
    if mode == "hang":
        time.sleep(3600)
    if mode == "crash":
        os.kill(os.getpid(), 9)
    # what real ncu says of each kernel under kernel replay: its passes (the cache counters alone
    # fit one; $FAKE_NCU_PASSES overrides)
    if opts.get("--replay-mode", ["kernel"])[-1] == "kernel":
        metrics = set(",".join(opts.get("--metrics", [])).split(","))
        passes = int(os.environ.get("FAKE_NCU_PASSES") or (1 if metrics <= CACHE_ONLY and not opts.get("--section")
                                                             else 18))
        for name in pushed:
            if name.startswith("chz/"):
                print(f'==PROF== Profiling "chz_kernel": 0%....50%....100% - {passes} pass{"es" if passes > 1 else ""}')
    export = opts["--export"][0]
    shutil.copy(os.environ["FAKE_NCU_REPORT"], export)
    print(f"==PROF== Disconnected from process {os.getpid()}")
    print(f"==PROF== Report: {export}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
