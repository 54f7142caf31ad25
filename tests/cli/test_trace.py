"""Your trace in one command: `predict --trace FILE` and `run --trace FILE` infer T, E and
the bags from the file, take D (and a flat stream's T) from the options or refuse in one
line naming them, and keep the file's own bag boundaries for the model and the bench."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from characterize.cli import main
from characterize.config import WorkloadConfig
from characterize.errors import ConfigError, MissingInput
from characterize.pipeline import trace_experiment
from characterize.workloads.shape import FORMATS, infer_workload, trace_shape
from characterize.workloads.traces import generate, load_dataset, write_trace
from tests.conftest import needs_tools


@pytest.fixture(scope="module")
def bagged(tmp_path_factory) -> Path:
    """3 tables of 4 batches x 127 bags of 1..20 lookups over 1009 rows, in the dlrm_datasets layout."""
    wl = WorkloadConfig(T=3, E=1009, D=68, B=127, L="uniform:1:20", batches=4, seed=3)
    return write_trace(generate("medium", wl), tmp_path_factory.mktemp("trace") / "mine.npz")


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("stream") / "ids.txt"
    np.savetxt(p, np.random.default_rng(0).integers(0, 129, 5000), fmt="%d")
    return p


def test_the_shape_of_a_bagged_file_and_of_a_stream(bagged, stream):
    s = trace_shape(bagged)
    assert (s.tables, s.bagged, s.bags) == (3, True, (508, 508, 508))
    assert s.rows <= 1009 and 1 <= s.mean_bag <= 20 and s.max_bag <= 20
    f = trace_shape(stream)
    assert (f.tables, f.bagged, f.lookups, f.rows) == (None, False, (5000,), 129)


def test_what_the_file_says_is_inferred_and_what_it_does_not_is_asked_for(bagged, stream):
    base = WorkloadConfig()
    with pytest.raises(MissingInput, match=r"does not say the embedding dimension D .*--D N") as e:
        infer_workload(trace_shape(bagged), base, {})
    assert e.value.names == ("D",)
    with pytest.raises(MissingInput, match=r"how many tables T .* pass --D N --T N") as e:
        infer_workload(trace_shape(stream), base, {})
    assert e.value.names == ("D", "T")
    got = infer_workload(trace_shape(bagged), base, {"D": 68})
    wl = got.workload
    assert (wl.T, wl.D, wl.B, wl.batches) == (3, 68, 254, 2) and wl.E == trace_shape(bagged).rows
    text = "\n".join(got.notes)
    assert "T=3 (the tables in the file)" in text and "largest index in the file + 1" in text
    assert "the file's own boundaries, kept by predict and bench alike" in text
    assert infer_workload(trace_shape(bagged), base, {"D": 68, "B": 127}).workload.batches == 4
    with pytest.raises(ConfigError, match="at most --B 508"):
        infer_workload(trace_shape(bagged), base, {"D": 68, "B": 600})
    with pytest.raises(ConfigError, match="--E 5 is too small"):
        infer_workload(trace_shape(bagged), base, {"D": 68, "E": 5})
    flat = infer_workload(trace_shape(stream), base, {"D": 64, "T": 2, "L": "7"})
    assert (flat.workload.T, str(flat.workload.L), flat.workload.E) == (2, "7", 129)
    assert "no bag boundaries" in "\n".join(flat.notes)


def test_the_file_s_own_bags_are_what_the_model_and_the_bench_read(bagged):
    """Both read a dataset through traces.load_dataset: the bag lengths are the file's."""
    made = trace_experiment(bagged, "quick", D=68, B=127)
    exp = made.experiment
    assert exp.datasets == (str(bagged),) and exp.dtypes == () and exp.name == "trace-mine"
    with np.load(bagged) as z:
        own = z["lengths"]
    ds = load_dataset(exp.datasets[0], exp.workload, tables=range(exp.workload.T))
    for t, table in enumerate(ds.tables):
        assert np.array_equal(table.lengths(), own[t][: exp.workload.B * exp.workload.batches])
    assert "warp" in exp.variants   # D=68 reads whole 16-byte vectors of fp32


def test_odd_D_leaves_out_the_variants_that_cannot_run_it(bagged):
    made = trace_experiment(bagged, "quick", D=33)
    # warp needs whole 16-byte vectors, FBGEMM's TBE D a multiple of 4
    assert not {"warp", "fbgemm"} & set(made.experiment.variants)
    assert "left out: fbgemm, warp" in "\n".join(made.notes)


def test_predict_without_D_off_a_terminal_is_one_line_naming_it(bagged, stream):
    r = CliRunner().invoke(main, ["predict", "--trace", str(bagged)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.stderr.strip().splitlines()[-1].startswith("error: ") and "pass --D N" in r.stderr
    r = CliRunner().invoke(main, ["predict", "--trace", str(stream), "--D", "64"])
    assert r.exit_code == 2 and "pass --T N" in r.stderr


def test_accepted_formats_are_in_workload_help():
    out = CliRunner().invoke(main, ["workload", "--help"]).output
    for line in FORMATS:
        assert line.split(":")[0] in out
    assert "keeps its own bags in predict and bench alike" in out


@needs_tools
def test_predict_a_trace_in_one_command(bagged):
    r = CliRunner().invoke(main, ["predict", "--trace", str(bagged), "--D", "68", "--arch", "a100-80gb", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert {x["dataset"] for x in rows} == {str(bagged)} and {x["gpu"] for x in rows} == {"a100-80gb"}
    r = CliRunner().invoke(main, ["predict", "--trace", str(bagged), "--D", "68", "--arch", "a100-80gb"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "trace mine.npz: npz with bag offsets" in r.stderr and "T=3 (the tables in the file)" in r.stderr
    assert "the answer: a100-80gb: use" in r.stdout and "nan" not in r.stdout.lower()
