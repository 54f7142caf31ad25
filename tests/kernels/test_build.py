import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from characterize import toolchain
from characterize.errors import BuildError, ToolchainNotFound
from characterize.files import one_at_a_time
from characterize.kernels import build as B
from characterize.kernels.build import (
    BuildSpec,
    build,
    build_many,
    demangle,
    find_nvcc,
    parse_ptxas,
)

# ptxas -v output as nvcc 13 prints it (captured from a real build of this family)
PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Overriding maximum register limit 256 for '_Z15chz_base_kernelILb0EEv12chz_bag_args' with  42 of maxrregcount option
ptxas info    : Compiling entry function '_Z15chz_base_kernelILb0EEv12chz_bag_args' for 'sm_80'
ptxas info    : Function properties for _Z15chz_base_kernelILb0EEv12chz_bag_args
    0 bytes stack frame, 56 bytes spill stores, 168 bytes spill loads
ptxas info    : Used 42 registers, used 0 barriers, 480 bytes cmem[0]
ptxas info    : Compile time = 12.3 ms
ptxas info    : Compiling entry function '_Z9smem_userPf' for 'sm_90'
ptxas info    : Function properties for _Z9smem_userPf
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]
"""


def test_parse_ptxas_reads_every_field():
    k = parse_ptxas(PTXAS_LOG)
    base = k["void chz_base_kernel<false>(chz_bag_args)"]
    assert (base.registers, base.spill_stores, base.spill_loads, base.arch, base.max_registers) == (42, 56, 168, "sm_80", 42)
    smem = k["smem_user(float*)"]
    assert (smem.registers, smem.shared_mem, smem.barriers, smem.stack_frame, smem.arch) == (30, 4096, 1, 8, "sm_90")


def test_demangle():
    assert demangle("_Z14chz_rpf_kernelILi2EEv12chz_bag_args") == "void chz_rpf_kernel<2>(chz_bag_args)"
    assert demangle("not_mangled") == "not_mangled"


def test_nvcc_is_found():
    tc = find_nvcc()
    assert tc.path.is_file() and tc.version[0].isdigit()


def test_missing_nvcc_says_how_to_get_one(monkeypatch):
    monkeypatch.setattr(toolchain, "candidates", lambda name, places=None: [])
    monkeypatch.delenv("CHARACTERIZE_NVCC", raising=False)
    B.find_nvcc.cache_clear()
    try:
        with pytest.raises(ToolchainNotFound, match=r"characterize\[nvcc\]"):
            find_nvcc()
    finally:
        B.find_nvcc.cache_clear()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_compiles_for_both_archs(arch):
    r = build(BuildSpec("cuda", arch))
    names = set(r.kernels)
    for expected in ["chz_base_kernel<false>", "chz_base_kernel<true>", "chz_l2_pin_kernel"] + \
            [f"chz_rpf_kernel<{p}>" for p in range(1, 9)] + \
            [f"chz_warp_kernel<{v}, {8 // v}>" for v in (1, 2, 4, 8)]:
        assert r.resources(expected).arch == arch
    assert all(k.registers > 0 for k in r.kernels.values()) and len(names) == 15
    assert r.library.is_file()


@pytest.mark.slow   # four more device-code builds per architecture (the SASS tests read the same ones)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "int8", "int8h"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_dtype_compiles_the_same_kernels_for_both_archs(arch, dtype):
    """One library per dtype under the fp32 kernel names: warp's 16-byte vectors hold 8
    fp16/bf16 or 16 int8 elements, so D <= 1024 needs at most 4 (fp16/bf16) or 2 (int8)
    per lane and the larger instances are not built: 14 and 13 kernels instead of 15. Read
    from the device code, whose kernels and resources are the library's
    (test_device_code_builds_read_like_the_library); the fp32 libraries are linked above."""
    r = build(BuildSpec("cuda", arch, dtype=dtype, output="cubin"))
    per_lane = 4 if dtype in ("fp16", "bf16") else 2
    warps = [v for v in (1, 2, 4, 8) if v <= per_lane]
    for expected in ["chz_base_kernel<false>", "chz_base_kernel<true>", "chz_l2_pin_kernel"] + \
            [f"chz_rpf_kernel<{p}>" for p in range(1, 9)] + \
            [f"chz_warp_kernel<{v}, {8 // v}>" for v in warps]:
        assert r.resources(expected).arch == arch
    assert len(r.kernels) == 11 + len(warps)
    # no spills where D=128 runs (the int8 V=2 kernel, D in 520..1024, may spill a few bytes)
    assert all(r.resources(k).spill_stores == 0 for k in ("chz_base_kernel<false>", "chz_rpf_kernel<2>",
                                                           "chz_warp_kernel<1, 8>"))
    assert dtype in r.spec.label()


def test_unknown_dtype_is_a_build_error():
    with pytest.raises(BuildError, match="int4"):
        BuildSpec("cuda", "sm_80", dtype="int4")


@pytest.mark.slow
def test_cache_hit_and_cap(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path))
    first = build(BuildSpec("cuda", "sm_80", 40))
    again = build(BuildSpec("cuda", "sm_80", 40))
    assert not first.cached and again.cached and again.library == first.library
    assert "-maxrregcount" in first.command and first.resources("chz_base_kernel<false>").registers <= 40
    both = build_many([BuildSpec("emulate"), BuildSpec("cuda", "sm_80", 40)])
    assert both[BuildSpec("cuda", "sm_80", 40)].cached and both[BuildSpec("emulate")].library.is_file()


def test_broken_source_is_a_build_error(tmp_path, monkeypatch):
    src = B.kernels_dir()
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "embedding_bag.cu").write_text((src / "embedding_bag.cu").read_text() + "\nthis is not C++;\n")
    monkeypatch.setenv("CHARACTERIZE_KERNELS", str(tmp_path))
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BuildError, match="failed"):
        build(BuildSpec("emulate"))
    monkeypatch.setenv("CHARACTERIZE_KERNELS", str(tmp_path / "missing"))
    with pytest.raises(BuildError, match="not found"):
        build(BuildSpec("emulate"))


def test_the_cuda_headers_dtype_codes_are_the_dtype_table():
    """config.DTYPES is the one home of the dtypes; the CUDA header's enum must match it."""
    from characterize.config import DTYPES

    header = (B.kernels_dir() / "chz_compat.cuh").read_text()
    enum = re.search(r"enum chz_dtype : int \{([^}]*)\}", header).group(1)
    codes = {name.strip().removeprefix("CHZ_").lower(): int(code) for name, code in
             (item.split("=") for item in enum.split(","))}
    assert codes == {d.name: d.code for d in DTYPES.values()}


def test_the_cuda_tool_version_probe(tmp_path):
    """One probe reads nvcc's and cuobjdump's versions: the real nvcc's, a tool without a
    version line (its last line), a silent one, and one that cannot run (a domain error
    naming the tool, from the build and from the SASS reader alike)."""
    from characterize.kernels.sass import disasm

    assert re.fullmatch(r"\d+\.\d+\.\d+", toolchain.cuda_tool_version(find_nvcc().path))
    odd, silent, broken = tmp_path / "odd", tmp_path / "silent", tmp_path / "broken"
    odd.write_text("#!/bin/sh\necho 'some tool'\necho 'build 7'\n")
    silent.write_text("#!/bin/sh\n")
    broken.write_text("not a program")
    for exe in (odd, silent):
        exe.chmod(0o755)
    assert toolchain.cuda_tool_version(odd) == "build 7"
    assert toolchain.cuda_tool_version(silent) == "unknown"
    with pytest.raises(toolchain.ToolDidNotRun):
        toolchain.cuda_tool_version(broken)
    for probe in (B._nvcc_version, disasm._tool_version):
        with pytest.raises(ToolchainNotFound, match=f"{broken} did not run"):
            probe(broken)


# --------------------------------------------------- the compiler the driver supports
def _stand_in_nvcc(folder, release: str):
    """A CUDA `release` nvcc for the choice alone (its version line): no CUDA 12 compiler
    can be installed here (PyPI's CUDA 12 nvcc wheel holds ptxas only)."""
    folder.mkdir(parents=True)
    exe = folder / "nvcc"
    exe.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    exe.chmod(0o755)
    return exe


def test_the_compiler_is_chosen_for_the_drivers_cuda_version(tmp_path):
    real = find_nvcc()
    old = _stand_in_nvcc(tmp_path / "cuda-12.4" / "bin", "12.4")
    found = [(real.path, "PATH"), (old, "/usr/local/cuda-12.4")]
    # a driver of CUDA 13 runs what the first (CUDA 13) nvcc builds
    new = B.choose_nvcc(found, "580.65.06", (13, 0))
    assert new.path == real.path and "chosen for driver 580.65.06 (CUDA 13.0)" in new.describe()
    # an R535 driver (CUDA 12.2): the CUDA 12 toolkit, minor versions being compatible within a major
    chosen = B.choose_nvcc(found, "535.104.05", (12, 2))
    assert chosen.path == old and chosen.version == "12.4.1" and "driver 535.104.05" in chosen.describe()
    # the build cache keeps the two toolkits' libraries apart
    spec = BuildSpec("cuda", "sm_80")
    assert B._cache_dir(spec, chosen) != B._cache_dir(spec, new)
    # no driver here: the first found, said so
    assert "no NVIDIA driver" in B.choose_nvcc(found, None, None).chosen


def test_a_driver_older_than_every_compiler_is_one_line_naming_both(tmp_path):
    real = find_nvcc()
    with pytest.raises(ToolchainNotFound) as e:
        B.choose_nvcc([(real.path, "PATH")], "470.57.02", (11, 4))
    msg = str(e.value)
    assert "\n" not in msg and "470.57.02" in msg and "CUDA up to 11.4" in msg
    assert f"CUDA {real.version.split('.')[0]} needs driver >= 580.65.06" in msg


def test_find_nvcc_asks_the_driver(monkeypatch, tmp_path):
    """find_nvcc with a stubbed driver (the driver needs a GPU): a CUDA 11 driver refuses
    the CUDA 13 compilers found here; a CUDA 13 driver builds with one, and says so."""
    monkeypatch.setattr(B, "driver_cuda_version", lambda: ("470.57.02", (11, 4)))
    B.find_nvcc.cache_clear()
    try:
        with pytest.raises(ToolchainNotFound, match="470.57.02"):
            B.find_nvcc()
        monkeypatch.setattr(B, "driver_cuda_version", lambda: ("580.65.06", (13, 0)))
        B.find_nvcc.cache_clear()
        monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path))
        result = B.build(BuildSpec("cuda", "sm_80"))
        assert "chosen for driver 580.65.06 (CUDA 13.0)" in result.compiler
    finally:
        B.find_nvcc.cache_clear()


def test_the_environments_nvcc_wheel_comes_before_usr_local_cuda(tmp_path):
    wheel = tmp_path / "site" / "nvidia" / "cu13" / "bin"
    _stand_in_nvcc(wheel, "13.5")
    system = _stand_in_nvcc(tmp_path / "usr" / "cuda" / "bin", "13.0")
    import sys

    sys.path.insert(0, str(tmp_path / "site"))
    try:
        places = toolchain.Places(path="", cuda_home="", cuda_parent=tmp_path / "usr", nsight_root=tmp_path / "x")
        found = toolchain.find_all("nvcc", "CHARACTERIZE_NVCC_UNSET", places=places)
    finally:
        sys.path.remove(str(tmp_path / "site"))
    mine = [(p, w) for p, w in found if str(p).startswith(str(tmp_path))]   # (the venv's own wheels aside)
    assert [w for _, w in mine] == ["pip wheel", str(tmp_path / "usr" / "cuda")] and mine[1][0] == system
    assert found[-1][0] == system   # every wheel before /usr/local/cuda


def test_builders_of_the_same_entry_at_once_compile_it_once(tmp_path, monkeypatch):
    """Two builders of one cache entry at once (the tasks of a Slurm array on a shared
    cache): the first compiles, the other waits for it and takes its library."""
    monkeypatch.setenv("CHARACTERIZE_CACHE", str(tmp_path))
    start = threading.Barrier(2)

    def builder() -> B.BuildResult:
        start.wait()
        return build(BuildSpec("emulate"))

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: builder(), range(2)))
    assert sorted(r.cached for r in results) == [False, True]
    assert results[0].library == results[1].library and results[0].library.is_file()


def test_a_lock_that_is_not_released_in_time_lets_the_work_go_on(tmp_path):
    lock = tmp_path / "locks" / "x.lock"
    with one_at_a_time(lock) as first:
        with one_at_a_time(lock, wait_s=0.2) as second:
            assert first and not second
    with one_at_a_time(lock, wait_s=0.2) as third:
        assert third
