import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from characterize.cli import main
from tests.conftest import HAS_GPU


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("preset", ["one-item", "high", "medium", "low", "random", "zipf:1.1"])
def test_workload_stats_every_preset(preset):
    r = run("workload", "stats", preset, "--rows", 50_000, "--lookups", 40_000, "--top-k", 1000, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["lookups"] == 40_000 and "1000" in d["top_k_coverage"] and d["reuse_distance_quantiles"]
    assert str(40 * 2**20 // 512) in d["top_k_coverage"]  # K fitting the A100 L2


def test_workload_stats_every_file_format(tmp_path):
    gen = run("workload", "generate", "medium", "-o", tmp_path / "g.npz", "--T", 2, "--E", 5000, "--B", 64, "--L", 20,
              "--batches", 2)
    assert gen.exit_code == 0, gen.output
    z = np.load(tmp_path / "g.npz")
    torch.save((torch.from_numpy(z["indices"]), torch.from_numpy(z["offsets"]), torch.from_numpy(z["lengths"])),
               tmp_path / "g.pt")
    np.save(tmp_path / "g.npy", z["indices"][:3000])
    np.savetxt(tmp_path / "g.txt", z["indices"][:3000], fmt="%d")
    for name in ("g.npz", "g.pt", "g.npy", "g.txt"):
        r = run("workload", "stats", tmp_path / name, "--rows", 5000, "--json", "--table", 0)
        assert r.exit_code == 0, (name, r.output)
        assert json.loads(r.output)["unique_rows"] > 100


def test_workload_stats_text_output_and_errors(tmp_path):
    r = run("workload", "stats", "medium", "--E", 20_000, "--lookups", 10_000)
    assert r.exit_code == 0 and "unique rows" in r.output and "top-60,000" in r.output
    (tmp_path / "bad.txt").write_text("3\n70000\n")
    bad = run("workload", "stats", tmp_path / "bad.txt", "--rows", 1000)
    assert bad.exit_code == 2 and "position 1" in bad.output and "Traceback" not in bad.output


def test_presets_listing():
    r = run("workload", "presets", "--json")
    assert {p["preset"] for p in json.loads(r.output)} == {"one-item", "high", "medium", "low", "random"}


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_devices_without_gpu():
    r = run("devices")
    assert r.exit_code == 0 and "No CUDA GPU" in r.output
    assert json.loads(run("devices", "--json").output) == []


def test_check_command_passes_and_wrong_fails():
    ok = run("check", "--variants", "base,warp,l2w", "--datasets", "medium", "--backend", "emulate")
    assert ok.exit_code == 0, ok.output
    assert "all 6 checks passed" in ok.output
    bad = run("check", "--variants", "wrong", "--datasets", "random", "--backend", "emulate")
    assert bad.exit_code == 1 and "failed" in bad.output


def test_bad_config_is_a_message_not_a_traceback():
    r = run("check", "--D", 0)
    assert r.exit_code == 2 and "D must be a positive integer" in r.output and "Traceback" not in r.output
    r = run("check", "--variants", "base,warp", "--D", 30, "--datasets", "high", "--backend", "emulate")
    assert r.exit_code == 0 and "2 skipped" in r.output and "multiple of 4" in r.output
    r = run("check", "--variants", "warp", "--D", 30, "--datasets", "high", "--backend", "emulate")
    assert r.exit_code == 1 and "nothing was checked" in r.output


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path")
def test_selftest_without_a_gpu_says_so_and_exits_non_zero(tmp_path):
    r = run("selftest", "--gpu", "--out", tmp_path / "ref")
    assert r.exit_code == 4 and "no CUDA device is visible" in r.output and "Traceback" not in r.output
    assert r.output.index("self-test plan: about") < r.output.index("no CUDA device")   # the plan comes first
    assert not (tmp_path / "ref").exists()
    r = run("selftest")
    assert r.exit_code == 2 and "pass --gpu" in r.output


@pytest.mark.gpu
@pytest.mark.slow
def test_selftest_runs_the_whole_gpu_path_in_minutes(tmp_path):
    import time

    from characterize.store import load_run

    start = time.perf_counter()
    r = run("selftest", "--gpu", "--out", tmp_path / "ref")
    assert r.exit_code == 0, r.output
    assert time.perf_counter() - start < 600
    ref = load_run(tmp_path / "ref")
    assert ref.failures.empty and not ref.bench.empty and (tmp_path / "ref" / "report.html").is_file()
