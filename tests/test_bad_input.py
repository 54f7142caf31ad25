"""Bad input, case by case (issue 13): each is a one-line `error: ...` naming the problem
and what to do, a non-zero exit code, no traceback, and nothing finished is lost.
Process hygiene (case 1 and the build litter of case 10) is in tests/measure/test_hygiene.py,
fuzzed readers in tests/extract/test_fuzz.py and tests/workloads/test_trace_fuzz.py."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner, Result

from characterize.cli import main
from characterize.config import WorkloadConfig
from characterize.errors import WorkloadError
from characterize.pipeline import load_experiment, locality_step, open_experiment_run
from characterize.units import format_bytes
from tests.conftest import write_experiment

CSV_DIR = Path(__file__).parent / "data" / "ncu_csv"


def cli(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(r: Result, code: int, *needles: str) -> str:
    """The command failed with `code` and exactly one error line, the last one, holding `needles`."""
    assert r.exit_code == code, (r.exit_code, r.output)
    assert isinstance(r.exception, SystemExit), r.exception  # not an exception escaping the CLI
    assert "Traceback" not in r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().splitlines()[-1] == errors[0], r.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def toml(tmp_path: Path, text: str, name: str = "x.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------- 2. non-UTF-8 bytes in a report
def _mutated(fixtures: Path, tmp_path: Path, needle: bytes, which: int) -> Path:
    """The A100 fixture with one byte of a stored name replaced by 0xFF (not UTF-8)."""
    raw = bytearray((fixtures / "a100_mistic_msdnew.ncu-rep").read_bytes())
    hits = [i for i in range(len(raw) - len(needle)) if raw[i:i + len(needle)] == needle]
    raw[hits[which] + 4] = 0xFF
    out = tmp_path / f"bad-{needle.decode()}.ncu-rep"
    out.write_bytes(bytes(raw))
    return out


@pytest.mark.parametrize("needle, which, what", [(b"nodeByPoint", -1, "the kernel name"),
                                                 (b"gpu__time_duration", 0, "a metric name")])
def test_non_utf8_names_in_a_report_are_one_line_for_import_report_and_compare(tmp_path, ncu_fixtures, needle,
                                                                                which, what):
    bad = _mutated(ncu_fixtures, tmp_path, needle, which)
    good = ncu_fixtures / "a100_mistic_msdnew.ncu-rep"
    for args in (["import", bad], ["import", bad, "-o", tmp_path / "x.csv"], ["report", bad, "-o", tmp_path / "r.html"],
                 ["compare", good, bad]):
        refused(cli(*args), 7, f"{bad}: corrupt: {what} of result 1 is not valid UTF-8", "re-run the profile")


# ------------------------------------------------------------ 3. broken CSV exports
def _details_without(tmp_path: Path, column: str) -> Path:
    text = (CSV_DIR / "a100_msdkt23_details.csv").read_text()
    start = text.index('"ID"')
    rows = list(csv.reader(io.StringIO(text[start:])))
    drop = rows[0].index(column)
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(
        [c for j, c in enumerate(r) if j != drop] for r in rows)
    p = tmp_path / "no-value.csv"
    p.write_text(text[:start] + out.getvalue())
    return p


def test_a_details_export_without_metric_value_is_not_read_as_a_raw_page(tmp_path):
    refused(cli("import", _details_without(tmp_path, "Metric Value")), 7,
            "a details-page export", "without the Metric Value column", "--page details")


def test_an_unbalanced_quote_in_a_csv_export_is_refused_by_line(tmp_path):
    lines = (CSV_DIR / "a100_msdkt23_details.csv").read_text().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if '"register/thread","30"' in line)
    lines[n] = lines[n].replace('"register/thread","30"', '"register/thread","30')
    p = tmp_path / "quote.csv"
    p.write_text("".join(lines))
    refused(cli("import", p), 7, f"{p}, line {n + 1}: broken quoting", "export it again")


# ------------------------------------------------------------ 4. memory budgets
@pytest.mark.parametrize("args, needle", [
    (["--B", 100_000_000], "120,000,000,000 lookups"),
    (["--E", 4_000_000_000], "E=4,000,000,000 rows"),
])
def test_statistics_beyond_the_memory_budget_are_refused_before_allocating(args, needle):
    err = refused(cli("workload", "stats", "medium", *args), 2, "would need about", needle, "more than the budget of",
                  "CHARACTERIZE_MEMORY_BUDGET")
    assert "of the" in err and "available" in err  # the default budget says what it is a share of


def test_the_memory_budget_can_be_set(monkeypatch):
    refused(cli("--memory-budget", "1M", "workload", "stats", "medium"), 2, "budget of 976.6 KiB")
    monkeypatch.setenv("CHARACTERIZE_MEMORY_BUDGET", "2M")
    refused(cli("workload", "stats", "medium"), 2, "CHARACTERIZE_MEMORY_BUDGET=2M")
    refused(cli("--memory-budget", "lots", "workload", "stats", "medium"), 2, "bad memory budget 'lots'")
    assert cli("--memory-budget", "50%", "workload", "stats", "medium", "--lookups", 5000).exit_code == 0


def test_an_experiment_beyond_the_host_memory_budget_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARACTERIZE_MEMORY_BUDGET", "64M")
    exp = toml(tmp_path, 'name = "x"\ndatasets = ["medium"]\narchs = ["sm_80"]\n')  # the paper's workload
    refused(cli("run", exp, "--out", tmp_path / "run"), 2, "dataset medium", "would need about", "budget of 61.0 MiB")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------- 4, 5. configurations that fit no GPU
@pytest.mark.parametrize("field, value", [("E", 10_000_000_000), ("E", 500_000_000), ("T", 5000)])
def test_a_workload_that_fits_no_target_gpu_is_refused_before_any_work(tmp_path, field, value):
    exp = toml(tmp_path, f'name = "x"\narchs = ["sm_80"]\n[workload]\n{field} = {value}\n')
    need = format_bytes(WorkloadConfig().replace(**{field: value}).device_bytes())
    refused(cli("predict", exp), 2, f"needs about {need} of GPU memory",
            "NVIDIA A100-SXM4-80GB has 80.0 GiB", "lower T, E")
    refused(cli("run", exp, "--out", tmp_path / "run"), 2, "GPU memory")
    assert not (tmp_path / "run").exists()


def test_predicting_for_a_smaller_gpu_checks_that_gpu(tmp_path):
    big = toml(tmp_path, 'name = "x"\narchs = ["sm_80"]\n[workload]\nE = 5000000\n')  # 13 x 2.4 GiB: A100, not A10
    refused(cli("predict", big, "--arch", "a10"), 2, "NVIDIA A10 has 24.0 GiB")


# ------------------------------------------------------- 6. missing trace files
def test_a_missing_trace_file_is_refused_before_any_work(tmp_path):
    exp = write_experiment(tmp_path, datasets=("medium", "nonexistent.npz"), variants=("base",))
    refused(cli("run", exp, "--out", tmp_path / "run"), 2, "dataset nonexistent.npz: no such trace file",
            "remove it from the experiment")
    assert not (tmp_path / "run").exists()


def test_a_trace_that_fails_costs_only_its_own_locality(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\nthree\n")
    exp = load_experiment(str(write_experiment(tmp_path, datasets=("medium", str(bad), "random"))))
    run = open_experiment_run(exp, tmp_path / "run", "bench", False, None, backend="emulate")
    with pytest.raises(WorkloadError, match=r"bad\.txt, line 3: 'three' is not an integer index"):
        locality_step(run, exp)
    assert set(json.loads((run.path / "locality.json").read_text())) == {"medium", "random"}


@pytest.mark.slow
def test_a_run_whose_step_failed_exits_non_zero_after_writing_everything_else(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\nthree\n")
    exp = write_experiment(tmp_path, datasets=("medium", str(bad)), variants=("base", "warp"))
    out = tmp_path / "run"
    err = refused(cli("run", exp, "--out", out), 9, "step(s) failed: locality: ", "bad.txt, line 3: 'three'",
                  f"everything else is in {out}")
    failed = err.split("step(s) failed")[0].split()[-1]
    # the file is named once per step it failed (locality, and the steps that read the traces), never twice in one
    assert err.count("bad.txt, line 3") <= int(failed)
    assert list(json.loads((out / "locality.json").read_text())) == ["medium"]
    assert (out / "report.html").is_file() and (out / "static.csv").is_file()


# -------------------------------------------------------------- 7. bad TOML values
@pytest.mark.parametrize("text, message", [
    ('maxrregcount = ["48"]', "maxrregcount must be a list of integers, got ['48']; write the numbers without quotes"),
    ('[bench]\nwarmup = "2"', "bench.warmup must be an integer, got '2'; write the number without quotes"),
    ('[bench]\nbudget_s = "fast"', "bench.budget_s must be a number, got 'fast'"),
    ('[workload]\nT = true', "workload.T must be an integer, got True"),
    ('datasets = "medium"', "datasets must be a list of strings, got 'medium'"),
    ("workload = 3", "workload must be a table, got 3"),
])
def test_bad_toml_values_name_the_field(tmp_path, text, message):
    refused(cli("predict", toml(tmp_path, f'name = "x"\n{text}\n')), 2, message)


def test_a_non_utf8_or_empty_experiment_file_is_refused(tmp_path):
    p = tmp_path / "latin.toml"
    p.write_bytes(b'name = "x"\ndescription = "caf\xe9"\n')
    refused(cli("predict", p), 2, "not UTF-8 text (byte 0xe9 at offset 29)", "save the experiment file as UTF-8")
    refused(cli("run", toml(tmp_path, "", "empty.toml")), 2, "the experiment file is empty")
    assert load_experiment(str(toml(tmp_path, "[workload]\nE = 1009\n", "unnamed.toml"))).name == "unnamed"


# ------------------------------------------------------------------- 8. odd traces
def test_odd_traces_are_one_line(tmp_path):
    (tmp_path / "big.txt").write_text("1\n99999999999999999999999\n")
    refused(cli("workload", "stats", tmp_path / "big.txt"), 2, "big.txt, line 2: index 99999999999999999999999 "
            "does not fit 64 bits")
    np.save(tmp_path / "cube.npy", np.zeros((2, 3, 4), dtype=np.int64))
    refused(cli("workload", "stats", tmp_path / "cube.npy"), 2, "a .npy trace is 1-D (one stream) or 2-D (one row "
            "per table); got shape (2, 3, 4)")
    np.save(tmp_path / "u64.npy", np.array([1, 2**63 + 5], dtype=np.uint64))
    err = refused(cli("workload", "stats", tmp_path / "u64.npy"), 2, "position 1",
                  "value 9223372036854775813 does not fit 64-bit signed indexing")
    assert "negative" not in err


# ------------------------------------------------------------ 9. import -o DIR/...
def test_import_creates_the_output_directory(tmp_path):
    out = tmp_path / "new" / "sub" / "x.csv"
    r = cli("import", CSV_DIR / "h800_sglang_raw.csv", "-o", out)
    assert r.exit_code == 0, r.output
    assert len(pd.read_csv(out)) > 0
    refused(cli("import", CSV_DIR / "h800_sglang_raw.csv", "-o", tmp_path / "x.xlsx"), 2, "must end in .csv or .parquet")


# -------------------------------------------------------------------- 10. small ones
@pytest.mark.parametrize("k", [0, -1])
def test_top_k_must_be_positive(k):
    refused(cli("workload", "stats", "medium", "--lookups", 1000, "--top-k", k), 2, f"needs K >= 1 (rows), got {k}")


def test_a_negative_index_is_not_called_truncated(tmp_path):
    (tmp_path / "neg.txt").write_text("1\n-4\n")
    err = refused(cli("workload", "stats", tmp_path / "neg.txt"), 2, "table 0, position 1: negative index -4")
    assert "truncated" not in err


def test_a_pt_file_of_python_objects_is_refused_in_one_line(tmp_path):
    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "model.pt")
    err = refused(cli("workload", "stats", tmp_path / "model.pt"), 2, "holds Python objects, not plain tensors",
                  "convert it to .npz")
    assert len(err) < 300


def test_cli_errors_never_print_a_traceback_for_unwritable_outputs(tmp_path):
    (tmp_path / "file").write_text("")
    refused(cli("workload", "generate", "medium", "--E", 1000, "--B", 8, "--L", 2, "--batches", 1, "-o",
                tmp_path / "file" / "x.npz"), 2, "cannot write")
    refused(cli("import", CSV_DIR / "h800_sglang_raw.csv", "-o", tmp_path / "file" / "x.csv"), 2, "cannot write")


def test_the_bad_input_table_in_the_docs_lists_every_case():
    page = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    table = page[page.index("## Bad input"):]
    for phrase in ("not valid UTF-8", "Metric Value", "broken quoting", "would need about", "GPU memory",
                   "no such trace file", "must be an integer", "not UTF-8 text", "does not fit 64",
                   "1-D (one stream)", "K >= 1", "Python objects", "being written by another process",
                   "the experiment file is empty", "dies with", "crashed on it (SIGABRT)"):
        assert phrase in table, phrase


# ------------------------------------------------------- did you mean, before anything else
def test_a_typo_is_named_before_the_gpu_ncu_or_slurm_is_looked_for(tmp_path):
    """Unknown variants, datasets, GPUs and experiments: one line with the closest known
    name, before the no-GPU (bench), no-ncu (profile) or no-Slurm refusals could hide it."""
    refused(cli("bench", "quick", "--variants", "base,rfp"), 2, "unknown variant 'rfp'", "Did you mean 'rpf'?")
    refused(cli("profile", "quick", "--datasets", "meduim", "--ncu", tmp_path / "no-ncu"), 2,
            "unknown dataset 'meduim'", "Did you mean 'medium'?")
    refused(cli("bench", "quick", "--variants", "wrap", "--executor", "slurm"), 2, "Did you mean 'warp'?")
    refused(cli("run", "papr"), 2, "no experiment 'papr'", "Did you mean 'paper'?")
    refused(cli("predict", "quick", "--arch", "h10"), 2, "unknown GPU 'h10'", "Did you mean 'h100'")
    refused(cli("bench", "quick", "--variants", "zzzz"), 2, "unknown variant 'zzzz'")
    assert "Did you mean" not in cli("bench", "quick", "--variants", "zzzz").stderr


def test_a_dtype_no_kernel_reads_is_refused_by_name_not_built_as_nothing():
    refused(cli("build", "--dtype", "fp64", "--arch", "sm_90"), 2, "dtype 'fp64' is not supported", "fp32")
    refused(cli("build", "--dtype", "fp8", "--variants", "base", "--arch", "sm_90"), 2, "cannot read fp8")
