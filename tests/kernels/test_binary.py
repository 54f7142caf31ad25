"""`characterize sass --binary`: the SASS analysis of a CUDA library we did not build,
here one built in the test from the worked example of docs/model.md (examples/byok/mine.cu)
plus a kernel with no lookup loop, and its one-line refusals."""

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from characterize.cli import main
from characterize.errors import BinaryError
from characterize.kernels.binary import analyze_binary, compatible_arch, list_kernels
from characterize.kernels.build import find_nvcc, kernels_dir
from tests.conftest import needs_tools

MINE = Path(__file__).parents[2] / "examples" / "byok" / "mine.cu"
SCALE_CU = r"""
// no loop gathering rows: one load and one store per thread
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    """libmine.so (the example kernel, sm_80 and sm_90 code) and libscale.so (sm_80 only)."""
    out = tmp_path_factory.mktemp("byok")
    nvcc = str(find_nvcc().path)
    common = [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", f"-I{kernels_dir()}"]
    mine = out / "libmine.so"
    subprocess.run([*common, "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
                    "-o", str(mine), str(MINE)], check=True, capture_output=True)
    (out / "scale.cu").write_text(SCALE_CU)
    scale = out / "libscale.so"
    subprocess.run([*common, "-gencode", "arch=compute_80,code=sm_80", "-o", str(scale), str(out / "scale.cu")],
                   check=True, capture_output=True)
    return {"mine": mine, "scale": scale}


@needs_tools
def test_a_users_kernel_is_read_like_ours(libs):
    rows = analyze_binary(libs["mine"], "mine_kernel", ["sm_80", "sm_90"])
    assert [r.asked_arch for r in rows] == ["sm_80", "sm_90"]
    for r in rows:
        d = r.to_dict()
        assert d["registers"] > 0 and d["local_bytes"] == 0 and r.kernel.arch == r.asked_arch
        assert d["load_bits"].get(128) == 2 and d["row_loads"] == 2 and d["index_loads"] == 2
        assert d["lanes_per_bag"] == 32 and d["row_load_bits"] == 128
        # two rows per iteration, each behind its own index load: about 1 in the hot loop; over the nest
        # the index stream is sequential and mostly cached, so about the 2 rows the loop issues together
        assert 0.8 <= d["rows_in_flight"] <= 1.3 and 1.5 <= d["nest_rows_in_flight"] <= 2.3
        assert len(d["bag_latencies"]) >= 5


@needs_tools
def test_sass_binary_command_json_and_table(libs):
    res = CliRunner().invoke(main, ["sass", "--binary", str(libs["mine"]), "--kernel", "mine", "--arch", "sm_80",
                                    "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["arch"] == "sm_80" and row["kernel"].startswith("mine_kernel") and len(row["sha256"]) == 64
    table = CliRunner().invoke(main, ["sass", "--binary", str(libs["mine"]), "--kernel", "mine", "--arch", "90"])
    assert table.exit_code == 0 and "nest_rows_in_flight" in table.output and "mine_kernel" in table.output


@needs_tools
def test_a_later_minor_reads_its_majors_code(libs):
    use, funcs = list_kernels(libs["mine"], "sm_86")
    assert use == "sm_80" and any(k.name.startswith("mine_kernel") for k in funcs)
    assert compatible_arch("sm_90", ["sm_80", "sm_90a"]) == "sm_90a"
    assert compatible_arch("sm_89", ["sm_80", "sm_86", "sm_90"]) == "sm_86"
    assert compatible_arch("sm_80", ["sm_86", "sm_90"]) is None


@needs_tools
@pytest.mark.parametrize("args, message", [
    (["--kernel", "nosuch"], "no sm_80 function matches 'nosuch'"),
    (["--kernel", "mine", "--arch", "sm_75"], "holds sm_80, sm_90"),
    (["--kernel", "(unclosed"], "not a regular expression"),
])
def test_one_line_refusals(libs, args, message):
    res = CliRunner().invoke(main, ["sass", "--binary", str(libs["mine"]), "--arch", "sm_80", *args]
                             if "--arch" not in args else ["sass", "--binary", str(libs["mine"]), *args])
    assert res.exit_code == BinaryError.exit_code and message in res.output and "Traceback" not in res.output


@needs_tools
def test_no_lookup_loop_names_the_kernels_read(libs):
    with pytest.raises(BinaryError, match=r"no loop gathering table rows in the 1 sm_80 function\(s\) read \(scale"):
        analyze_binary(libs["scale"], "scale", ["sm_80"])


def test_a_missing_or_non_binary_path_is_named(tmp_path):
    for path, why in ((tmp_path / "nope.so", "no such file"), (tmp_path, "not a regular file")):
        res = CliRunner().invoke(main, ["sass", "--binary", str(path)])
        assert res.exit_code == BinaryError.exit_code and why in res.output and "Traceback" not in res.output
