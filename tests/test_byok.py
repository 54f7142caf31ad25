"""Bring your own kernel: an experiment's [variants.NAME] table names a kernel of one's
own (examples/byok/mine.cu, docs/model.md's worked example), which is built, read from its
SASS and predicted beside the family, checked on the CPU emulator against torch, timed
by the bench harness, and launched through a Python callable as well as a C entry."""

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from characterize import pipeline
from characterize.config import ExperimentConfig, UserKernel, read_experiment
from characterize.errors import ConfigError
from characterize.kernels.check import check_one, make_table
from characterize.kernels.registry import get_variant, register_user
from characterize.measure.worker import kernel_filter, matching_launches
from tests.conftest import needs_tools

EXAMPLE = Path(__file__).parents[1] / "examples" / "byok"


def experiment(tmp_path: Path, table: str, name: str = "mine", variants: str = "[variants.base]\n") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(f'name = "{name}"\ndatasets = ["high"]\narchs = ["sm_80"]\n[workload]\nT = 2\nE = 20011\nD = 68\n'
                 f'B = 127\nL = "uniform:0:20"\nbatches = 2\n{variants}[variants.{name}]\n{table}')
    return p


def test_the_table_names_the_kernel_and_its_launch(tmp_path):
    shutil.copy(EXAMPLE / "mine.cu", tmp_path / "mine.cu")
    exp = read_experiment(str(experiment(tmp_path, 'source = "mine.cu"\nentry = "mine_forward"\nblock = [32, 4]\n')))
    assert exp.variants == ("base", "mine")
    k = exp.user_kernels["mine"]
    assert Path(k.source) == (tmp_path / "mine.cu").resolve() and k.block == (32, 4) and k.work == "bag"
    assert ExperimentConfig.from_dict(exp.to_dict()).user_kernels == exp.user_kernels   # meta.json round trip


@pytest.mark.parametrize("table, message", [
    ('entry = "f"\n', "give the kernel's source"),
    ('source = "nowhere.cu"\n', "does not exist"),
    ('source = "mine.cu"\nbinary = "mine.cu"\n', "one of the two"),
    ('source = "mine.cu"\nwork = "tile"\n', "work must be one of bag, chunk"),
    ('source = "mine.cu"\nblock = [30, 1]\n', "whole warps"),
    ('source = "mine.cu"\nkernel = "(x"\n', "not a regular expression"),
    ('source = "mine.cu"\ncolour = "red"\n', "has no field(s) colour"),
    ('source = "mine.cu"\nentry = "f"\ncallable = "m:f"\n', "not both"),
])
def test_a_bad_table_is_one_line_naming_the_field(tmp_path, table, message):
    shutil.copy(EXAMPLE / "mine.cu", tmp_path / "mine.cu")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        read_experiment(str(experiment(tmp_path, table)))


def test_a_built_in_name_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="warp is a built-in variant"):
        register_user("warp", UserKernel(source=str(EXAMPLE / "mine.cu")).validate("warp"))


@needs_tools
def test_your_kernel_is_predicted_from_its_own_sass_beside_the_family():
    exp = pipeline.load_experiment(str(EXAMPLE / "mine.toml"))
    df = pipeline.predict(exp, ["sm_80", "h100-sxm"])
    mine = df[df["variant"] == "mine"]
    assert len(mine) == len(exp.datasets) * 2 and (mine["time_us"] > 0).all()
    assert mine["kernel_source"].str.startswith("yours: ").all() and mine["note"].str.contains("sha256").all()
    # its SASS: two rows per iteration, each behind its own index load; the nest keeps about 2 in flight
    assert mine["loads_in_flight"].between(1.5, 2.5).all() and (mine["speedup_vs_base"] > 1).all()
    assert mine["registers"].between(16, 96).all()


@needs_tools
def test_your_kernel_is_checked_on_the_cpu_and_a_wrong_one_fails(tmp_path):
    exp = pipeline.load_experiment(str(EXAMPLE / "mine.toml"))
    assert get_variant("mine").user == exp.user_kernels["mine"]
    g = torch.Generator().manual_seed(4)
    lengths = torch.randint(0, 9, (37,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)[:-1]])
    indices = torch.randint(0, 1009, (int(lengths.sum()),), generator=g)
    for mode in ("sum", "mean"):
        r = check_one("mine", make_table("fp32", 1009, 36), indices, offsets, mode=mode, backend="emulate")
        assert r.passed and r.offset2bag_ok is None, r
    refused = check_one("mine", make_table("fp16", 1009, 36), indices, offsets, backend="emulate")
    assert refused.passed is None and "cannot read fp16" in refused.error
    # the same kernel with its odd last row dropped: the checker must catch it
    wrong = (tmp_path / "wrong.cu")
    wrong.write_text((EXAMPLE / "mine.cu").read_text().replace("if (i < end) {", "if (false) {"))
    pipeline.load_experiment(str(experiment(tmp_path, f'source = "{wrong}"\nentry = "mine_forward"\n'
                                                      'kernel = "mine_kernel"\nblock = [32, 4]\n', name="broken")))
    bad = check_one("broken", make_table("fp32", 1009, 36), indices, offsets, backend="emulate")
    assert bad.passed is False and bad.max_abs_err > bad.tolerance


def numpy_forward(args, launch, stream) -> int:
    """A launch wrapper written in Python, with the signature of the toolkit's: it reads
    the tables through the argument structure's pointers (the CPU backend's tensors)."""
    n, B, D = args.num_indices, args.num_bags, args.dim
    w = np.ctypeslib.as_array(ctypes.cast(args.weight, ctypes.POINTER(ctypes.c_float)), (args.num_rows, D))
    idx = np.ctypeslib.as_array(ctypes.cast(args.indices, ctypes.POINTER(ctypes.c_int64)), (max(n, 1),))[:n]
    off = np.ctypeslib.as_array(ctypes.cast(args.offsets, ctypes.POINTER(ctypes.c_int64)), (B,))
    out = np.ctypeslib.as_array(ctypes.cast(args.output, ctypes.POINTER(ctypes.c_float)), (B, D))
    ends = np.append(off[1:], n)
    for b in range(B):
        rows = w[idx[off[b]:ends[b]]]
        out[b] = rows.sum(0) if args.mode == 0 or len(rows) == 0 else rows.mean(0)
    return 0


def test_a_python_callable_runs_as_a_variant(tmp_path):
    shutil.copy(EXAMPLE / "mine.cu", tmp_path / "mine.cu")
    pipeline.load_experiment(str(experiment(tmp_path, 'source = "mine.cu"\n'
                                                      'callable = "tests.test_byok:numpy_forward"\n', name="pyk")))
    W = make_table("fp32", 211, 12)
    idx, off = torch.tensor([3, 5, 7, 3, 210]), torch.tensor([0, 2, 2])
    for mode in ("sum", "mean"):
        r = check_one("pyk", W, idx, off, mode=mode, backend="emulate")
        assert r.passed, r


@needs_tools
def test_a_binary_is_read_but_not_run_on_the_cpu(tmp_path):
    from characterize.kernels.user import library_path

    lib = library_path(UserKernel(source=str(EXAMPLE / "mine.cu")).validate("x"), "cuda", "sm_80")
    shutil.copy(lib, tmp_path / "libmine.so")
    exp = pipeline.load_experiment(str(experiment(tmp_path, 'binary = "libmine.so"\nentry = "mine_forward"\n'
                                                            'kernel = "mine_kernel"\nblock = [32, 4]\n', name="bin")))
    df = pipeline.predict(exp, ["sm_80"])
    assert (df[df["variant"] == "bin"]["time_us"] > 0).all()
    r = check_one("bin", make_table("fp32", 1009, 36), torch.tensor([1, 2]), torch.tensor([0]), backend="emulate")
    assert r.passed is None and "give its source" in r.error


def test_ncu_profiles_your_kernel_too():
    exp = pipeline.load_experiment(str(EXAMPLE / "mine.toml"))
    assert "(?:mine_kernel)" in kernel_filter(exp) and matching_launches("mine") == 1
