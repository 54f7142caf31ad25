"""The SASS analysis on real nvcc output: the kernels keep the rows in flight they
claim, spills inside the hot loop are found, and a serialized kernel scores as
serialized. A few parser tests on short snippets pin down the operand rules."""

import json
import subprocess

import pytest
from click.testing import CliRunner

from characterize import toolchain
from characterize.errors import ToolchainNotFound
from characterize.kernels import sass as S
from characterize.kernels.build import BuildSpec, build, find_nvcc
from characterize.kernels.sass import (
    NEST_L,
    analyze_kernel,
    disasm,
    find_cuobjdump,
    find_loops,
    instruction_frame,
    interpolate,
    kernels_in,
    parse_instruction,
    parse_sass,
)
from characterize.kernels.static import analyze_variants
from tests.conftest import missing_cuda_tools, needs_tools

ARCHS = ["sm_80", "sm_90"]


def ins(text: str):
    return parse_instruction("k", "sm_80", 0x100, text)


# ---------------------------------------------------------------- parser units
def test_vector_loads_write_consecutive_registers():
    i = ins("LDG.E.128.CONSTANT R8, desc[UR6][R18.64+0x10]")
    assert i.opcode == "LDG" and i.modifiers == ("E", "128", "CONSTANT") and i.width_bits == 128
    assert i.dests == ("R8", "R9", "R10", "R11") and i.address_regs == ("R18", "R19")
    assert set(i.srcs) == {"UR6", "R18", "R19"} and i.is_global_load
    j = ins("@!P0 LDG.E.64 R30, [R10.64]")
    assert j.predicate == "!P0" and j.dests == ("R30", "R31") and "P0" in j.srcs


def test_results_carries_and_pairs():
    assert ins("IADD3 R3, P1, R46, 0x1, RZ").dests == ("R3", "P1")
    setp = ins("ISETP.GE.AND.EX P0, PT, R45, c[0x0][0x16c], PT, P0")
    assert setp.dests == ("P0",) and set(setp.srcs) == {"R45", "P0"}
    wide = ins("IMAD.WIDE.U32 R36, R36, c[0x0][0x0], R18")
    assert wide.dests == ("R36", "R37") and set(wide.srcs) == {"R36", "R18", "R19"}
    assert ins("CS2R R46, SRZ").dests == ("R46", "R47")
    store = ins("STG.E.64 [R4.64], R2")
    assert store.dests == () and set(store.srcs) == {"R4", "R5", "R2", "R3"}
    assert set(ins("P2R R38, PR, RZ, 0x8").srcs) == {"P3"}
    shfl = ins("SHFL.IDX PT, R15, R31, R41, R35")
    assert shfl.dests == ("R15",) and set(shfl.srcs) == {"R31", "R41", "R35"}
    assert ins("CCTL.E.PML2 [R4]").is_prefetch and ins("CCTL.E.PF2 [R4]").is_prefetch
    assert ins("@P6 BRA 0x2f30").target == 0x2f30 and ins("@P6 BRA 0x2f30").conditional
    assert not ins("BRA 0x2f30").conditional and ins("BRA.DIV UR8, 0x22b0").conditional


LISTING = """
\tcode for sm_80
\t\tFunction : _Z4demoPKlPKfPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.64 R2, [R8.64] ;
        /*0020*/                   LEA R4, P0, R2, c[0x0][0x168], 0x2 ;
        /*0030*/                   LEA.HI.X R5, R2, c[0x0][0x16c], R3, 0x2, P0 ;
        /*0040*/                   LDG.E R6, [R4.64] ;
        /*0050*/                   FADD R0, R0, R6 ;
        /*0060*/                   IADD3 R8, P1, R8, 0x8, RZ ;
        /*0070*/                   IADD3.X R9, RZ, R9, RZ, P1, !PT ;
        /*0080*/                   ISETP.NE.AND P2, PT, R8, R10, PT ;
        /*0090*/               @P2 BRA 0x10 ;
        /*00a0*/                   STG.E [R12.64], R0 ;
        /*00b0*/                   EXIT ;
"""


def test_loop_classification_and_replay_on_a_listing():
    (code,) = parse_sass(LISTING)
    assert code.name == "demo(long const*, float const*, float*)"
    (loop,) = find_loops(code)
    assert loop.innermost and loop.label == "0x0010-0x0090" and len(loop.path) == 9
    row = analyze_kernel(code)
    assert (row.row_loads, row.index_loads, row.lookups_per_iteration) == (1, 1, 1)
    assert row.load_bits == {32: 1, 64: 1}
    assert row.latencies_per_iteration == pytest.approx(2, abs=0.05)  # index, then row: serialized
    assert row.rows_in_flight == pytest.approx(0.5, abs=0.02)
    df = instruction_frame([code])
    assert list(df["opcode"][:3]) == ["MOV", "LDG", "LEA"] and df["dests"][1] == ("R2", "R3")


def test_missing_cuobjdump_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(toolchain, "candidates", lambda name, places=None: [])
    monkeypatch.delenv("CHARACTERIZE_CUOBJDUMP", raising=False)
    S.find_cuobjdump.cache_clear()
    try:
        with pytest.raises(ToolchainNotFound, match=r"pip install 'characterize\[sass\]'"):
            find_cuobjdump()
    finally:
        S.find_cuobjdump.cache_clear()


# ------------------------------------------------------------ real nvcc output
@pytest.fixture(scope="module")
def family():
    """Hot loops of every public variant, plus rpf at P=4 and warp at D=256."""
    rows = analyze_variants(None, ARCHS)
    rows += analyze_variants(["rpf", "combined"], ARCHS, params={"rpf": {"P": 4}, "combined": {"P": 4}})
    rows += analyze_variants(["warp"], ARCHS, D=256)
    return rows


def pick(rows, variant, arch, kernel_prefix, role="lookup"):
    found = [r for r in rows if r.variant == variant and r.arch == arch and r.role == role
             and r.kernel.startswith(kernel_prefix)]
    assert found, (variant, arch, kernel_prefix)
    return found[0]


@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
def test_base_keeps_about_one_row_in_flight(family, arch):
    r = pick(family, "base", arch, "chz_base_kernel<false>")
    assert 0.8 <= r.rows_in_flight <= 1.3, r
    assert r.row_loads == r.index_loads and r.local_mem_ops == 0


@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", ["rpf", "combined"])
@pytest.mark.parametrize("P", [2, 4])
def test_rpf_keeps_p_rows_in_flight(family, arch, variant, P):
    r = pick(family, variant, arch, f"chz_rpf_kernel<{P}>")
    assert r.rows_in_flight >= 0.8 * P, r
    assert r.row_loads == P and r.index_loads == P and r.local_mem_ops == 0
    assert r.maxrregcount is not None and r.registers <= r.maxrregcount


@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", ["chz_warp_kernel<1, 8>", "chz_warp_kernel<2, 4>"])  # D=128, D=256
def test_warp_keeps_its_16_byte_loads_in_flight(family, arch, kernel):
    r = pick(family, "warp", arch, kernel)
    assert r.rows_in_flight >= 6, r
    assert r.load_bits == {128: r.row_loads} and r.shuffles > 0 and r.local_mem_ops == 0


LOW_PRECISION = ["fp16", "bf16", "int8", "int8h"]


@pytest.fixture(scope="module")
def precision():
    """Hot loops of base, rpf and warp (D=128) in each reduced-precision library. rpf at its
    default register cap for int8, whose dequantization needs the most registers (choosing it
    builds every candidate cap); for the others at the cap that choice takes for each of them
    today (48 on both archs), which builds one library instead of three."""
    return {d: analyze_variants(["base", "rpf", "warp"], ARCHS, dtype=d,
                                params=None if d == "int8" else {"rpf": {"maxrregcount": 48}})
            for d in LOW_PRECISION}


@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_every_dtype_keeps_its_rows_in_flight(precision, arch, dtype):
    """Decoding (fp16/bf16 to fp32, int8 x scale + bias) happens after the loads issue:
    rpf keeps P rows, warp its 8 rows of 16-byte loads in flight, with no spills."""
    rows = precision[dtype]
    assert {r.dtype for r in rows} == {dtype}
    base = pick(rows, "base", arch, "chz_base_kernel<false>")
    # base waits on each row; int8's scale and bias loads add to its wait (about 0.5 rows)
    assert base.rows_in_flight >= (0.4 if dtype.startswith("int8") else 0.8), base
    assert (base.qparam_loads > 0) == dtype.startswith("int8")
    rpf = pick(rows, "rpf", arch, "chz_rpf_kernel<2>")
    assert rpf.rows_in_flight >= 0.8 * 2 and rpf.local_mem_ops == 0, rpf
    warp = pick(rows, "warp", arch, "chz_warp_kernel<1, 8>")
    assert warp.rows_in_flight >= 6 and warp.local_mem_ops == 0, warp
    assert warp.load_bits.get(128) == 8 and warp.shuffles > 0
    # a bag of up to 8 lookups takes warp's one 8-wide step, whatever the row type (int8's
    # scale and bias loads share a mnemonic with the tile's index loads: no remainder code)
    assert warp.bag_latencies[1] == warp.bag_latencies[8] > 2.5, warp.bag_latencies


# ------------------------------------------------------------ the whole loop nest
@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
def test_the_loop_nest_counts_what_the_hot_loop_leaves_out(family, arch):
    """Over a whole bag the warp kernel also waits for each tile's index load, the bag's
    offsets and its output store: fewer rows in flight than its inner loop's 8 (about 6 at
    L=150 on sm_80), while base, whose every lookup waits anyway, stays near one."""
    warp = pick(family, "warp", arch, "chz_warp_kernel<1, 8>")
    assert 5.0 <= warp.nest_rows_in_flight < warp.rows_in_flight, warp
    base = pick(family, "base", arch, "chz_base_kernel<false>")
    assert 0.8 <= base.nest_rows_in_flight <= 1.3, base
    rpf = pick(family, "rpf", arch, "chz_rpf_kernel<2>")
    assert 1.5 <= rpf.nest_rows_in_flight <= 2.6, rpf
    for r in (warp, base, rpf):
        lat = [r.bag_latencies[L] for L in NEST_L]
        ins = [r.bag_instructions[L] for L in NEST_L]
        # a longer bag waits longer, except that warp's bags of up to 8 lookups take its one
        # 8-wide step (the missing lookups load a stand-in row): the same path
        steady = [k for k, L in enumerate(NEST_L) if r.variant != "warp" or L >= 8]
        assert all(lat[b] > lat[a] for a, b in zip(steady, steady[1:])), r.variant
        assert all(ins[b] > ins[a] for a, b in zip(steady, steady[1:])), r.variant
        assert all(b >= a for a, b in zip(lat, lat[1:])) and all(b >= a for a, b in zip(ins, ins[1:])), r.variant
    # rpf at its default cap of 48 spills around its inner loop (per bag), never inside it
    assert base.spills_in_nest == warp.spills_in_nest == 0 and rpf.local_mem_ops == 0
    # a bag of one lookup waits for its chain of dependent loads: the bag's offsets, the
    # index read at them (base: its remainder code; warp: its tile), the row read at it
    assert base.bag_latencies[1] == pytest.approx(3.0, abs=0.3), base.bag_latencies
    assert warp.bag_latencies[1] == pytest.approx(3.0, abs=0.3), warp.bag_latencies
    assert warp.bag_latencies[1] == warp.bag_latencies[8]


def test_bag_figures_interpolate_between_the_sampled_lengths():
    samples = {1: 2.0, 2: 3.0, 4: 5.0, 8: 9.0}
    assert interpolate(samples, 3) == pytest.approx(4.0)
    assert interpolate(samples, 16) == pytest.approx(17.0)     # the last slope beyond
    assert interpolate(samples, 0.5) == pytest.approx(1.0)     # proportional below the first
    assert interpolate({}, 3) is None


@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
def test_l2_prepass_prefetches_with_evict_last(family, arch):
    r = pick(family, "l2p", arch, "chz_l2_pin_kernel", role="prepass")
    assert r.prefetches == {"CCTL.E.PML2": 1} and r.index_loads == 1 and r.rows_in_flight is None


@needs_tools
def test_a_small_cap_shows_spills_inside_the_loop():
    capped = analyze_variants(["rpf"], ["sm_80"], params={"rpf": {"P": 4, "maxrregcount": 32}})[0]
    assert capped.registers <= 32 and capped.local_mem_ops > 0
    assert capped.rows_in_flight < 2  # the spills serialize what the prefetch overlapped


SERIAL_CU = r"""
// Pointer chase: each load's address is the value of the load before it.
extern "C" __global__ void chase(const long long* next, long long start, int steps, long long* out) {
  long long p = start;
  for (int s = 0; s < steps; ++s) p = next[p];
  out[threadIdx.x] = p;
}

// The review's finding in miniature: P slots "prefetched" under a guard.
template <int P>
__global__ void guarded_prefetch(const float* table, const long long* idx, long long n, long long dim, float* out) {
  const float* column = table + threadIdx.x;
  float value[P];
#pragma unroll
  for (int p = 0; p < P; ++p) value[p] = p < n ? column[idx[p] * dim] : 0.f;
  float sum = 0.f;
  for (long long i = 0; i < n; i += P) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (i + p < n) {
        const float v = value[p];
        if (i + p + P < n) value[p] = column[idx[i + p + P] * dim];
        sum += v;
      }
    }
  }
  out[threadIdx.x] = sum;
}
template __global__ void guarded_prefetch<4>(const float*, const long long*, long long, long long, float*);
"""


def compiled_kernels(tmp_path_factory, name: str, source: str) -> dict:
    """The kernels of `source` compiled with -O3 for each of ARCHS, by architecture (a skip
    without nvcc or cuobjdump)."""
    if missing_cuda_tools():
        pytest.skip(f"cuobjdump or nvcc missing: {missing_cuda_tools()}")
    d = tmp_path_factory.mktemp(name)
    src = d / f"{name}.cu"
    src.write_text(source)
    out = {}
    for arch in ARCHS:
        cubin = d / f"{name}_{arch}.cubin"
        subprocess.run([str(find_nvcc().path), "-O3", "-cubin", f"-arch={arch}", "-o", str(cubin), str(src)],
                       check=True, capture_output=True)
        out[arch] = kernels_in(cubin)
    return out


@pytest.fixture(scope="module")
def serial_cubins(tmp_path_factory):
    return compiled_kernels(tmp_path_factory, "serial", SERIAL_CU)


@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
def test_a_pointer_chase_scores_as_serialized(serial_cubins, arch):
    r = analyze_kernel(serial_cubins[arch]["chase"])
    assert r.row_loads >= 1 and r.latencies_per_iteration == pytest.approx(r.row_loads, rel=0.1)
    assert r.rows_in_flight == pytest.approx(1.0, abs=0.1)


@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
def test_a_guarded_prefetch_scores_as_serialized(serial_cubins, arch):
    r = analyze_kernel(serial_cubins[arch]["guarded_prefetch<4>"])
    assert r.row_loads >= 4 and r.rows_in_flight < 1.2, r  # the source "prefetches" 4; the SASS waits on each


CHECKED_CU = r"""
// A bag per row of threads, a thread per column, its indices bounds-checked in a loop of
// their own before the lookup loop gathers the rows (how PyTorch's kernel has checked them
// since 2.10): nvcc unrolls both loops, each with remainder code for what a bag has left.
extern "C" __global__ void checked_bags(const long long* offsets, const long long* indices, const float* table,
                                        long long rows, long long dim, long long bags, float* out) {
  for (long long bag = blockIdx.x * (long long)blockDim.y + threadIdx.y; bag < bags;
       bag += (long long)gridDim.x * blockDim.y) {
    const long long begin = offsets[bag], end = offsets[bag + 1];
    bool bad = false;
    for (long long e = begin; e < end; ++e) bad |= indices[e] < 0 || indices[e] >= rows;
    if (bad) __trap();
    float sum = 0.f;
    for (long long e = begin; e < end; ++e) sum += table[indices[e] * dim + threadIdx.x];
    out[bag * dim + threadIdx.x] = sum;
  }
}
"""


@pytest.fixture(scope="module")
def checked_cubins(tmp_path_factory):
    return {arch: kernels["checked_bags"]
            for arch, kernels in compiled_kernels(tmp_path_factory, "checked", CHECKED_CU).items()}


@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
def test_a_short_bag_walks_the_code_a_bag_of_its_length_runs(checked_cubins, arch):
    """A bag of L lookups checks L indices and gathers L rows: the unrolled pieces of the
    check and of the lookup loop it does not have lookups for are passed by, and a bag of
    one waits for its offsets, the check's index and the row (the lookup's index read
    again hits L1): about three latencies, not the check's every unrolled piece."""
    from characterize.kernels.sass.loops import hot_loop
    from characterize.kernels.sass.nest import loop_nest, nest_latencies

    code = checked_cubins[arch]
    nest = loop_nest(code, hot_loop(code))
    walked = {L: nest_latencies(code, nest, L) for L in (1, 2, 4, 8, 16, 32)}
    assert walked[1][0] == pytest.approx(3.0, abs=0.3), walked
    # bags of a whole number of the unrolled step (4) take no remainder: their waits grow with L
    steps = [walked[L][0] for L in (4, 8, 16, 32)]
    assert all(b >= a - 0.05 for a, b in zip(steps, steps[1:])) and steps[-1] > steps[0] + 1, walked
    instructions = [walked[L][1] for L in (1, 2, 4, 8, 16, 32)]
    assert all(b > a for a, b in zip(instructions, instructions[1:])), walked


@needs_tools
def test_disassembly_is_cached_in_memory_and_on_disk(monkeypatch):
    lib = build(BuildSpec("cuda", "sm_80")).library
    first = S.disassemble(lib)
    assert S.disassemble(lib) is first  # same file, size and mtime: no work at all
    monkeypatch.setattr(disasm, "_TEXT_MEMO", {})

    def no_subprocess(*args, **kwargs):
        raise AssertionError("cuobjdump ran again")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert S.disassemble(lib) == first  # read back from the cache directory
    assert "chz_rpf_kernel<2>" in kernels_in(lib)


@needs_tools
def test_sass_command_json_and_table():
    from characterize.cli import main

    res = CliRunner().invoke(main, ["sass", "--arch", "sm_80", "--variants", "base,warp", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    keys = {"variant", "arch", "kernel", "loop", "instructions", "row_loads", "index_loads", "load_bits",
            "local_mem_ops", "latencies_per_iteration", "rows_in_flight"}
    assert {d["variant"] for d in data} == {"base", "warp"} and all(keys <= set(d) for d in data)
    table = CliRunner().invoke(main, ["sass", "--arch", "sm_90", "--variants", "rpf", "--param", "rpf.P=4"])
    assert table.exit_code == 0 and "chz_rpf_kernel<4>" in table.output and "rows in flight" in table.output
    bad = CliRunner().invoke(main, ["sass", "--variants", "warp", "--D", "30"])
    assert bad.exit_code == 2 and "multiple of 4" in bad.output


@needs_tools
def test_the_nest_replay_is_cached_and_a_damaged_entry_is_computed_again(own_cache):
    first = analyze_variants(["warp"], ["sm_80"])
    entries = sorted((own_cache / "sass" / "nest").glob("*.json"))
    assert entries and all(json.loads(p.read_text())["facts"] for p in entries)
    assert analyze_variants(["warp"], ["sm_80"]) == first        # read back
    for p in entries:
        p.write_text('{"facts": {"bags": [[1, ')                # torn
    assert analyze_variants(["warp"], ["sm_80"]) == first        # computed again
    assert all(json.loads(p.read_text())["facts"] for p in entries)
