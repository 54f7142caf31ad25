"""The peers' kernel facts (kernels/peers.csv): PyTorch's and FBGEMM's embedding kernels
read from their own wheels' SASS, with provenance; the instance FBGEMM's host code
picks per D; and, opt-in, the script that regenerates them from the wheels."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from characterize.errors import ConfigError
from characterize.kernels.peers import (
    PEER_VERSIONS,
    PEERS_CSV,
    fbgemm_layout,
    peer_facts,
    peer_kernel,
    walk_fingerprint,
)

ROOT = Path(__file__).parents[2]
WALK_REFERENCE = ROOT / "tests" / "data" / "walk_reference.sass"


def test_the_facts_cover_what_users_run_with_provenance():
    df = peer_facts()
    have = set(zip(df["peer"], df["dtype"], df["arch"]))
    for arch in ("sm_80", "sm_90"):
        for dtype in ("fp32", "fp16", "bf16", "int8"):
            assert ("torch", dtype, arch) in have
        for dtype in ("fp32", "fp16", "int8"):
            assert ("fbgemm", dtype, arch) in have
    assert set(df["version"].astype(str)) == set(PEER_VERSIONS.values())
    assert df["wheel"].str.endswith(".whl").all() and df["wheel_sha256"].str.fullmatch(r"[0-9a-f]{64}").all()
    assert df["sha256"].str.fullmatch(r"[0-9a-f]{64}").all() and df["symbol"].str.startswith("_Z").all()
    assert df["cuobjdump"].notna().all() and (df["registers"] > 0).all()
    # numbers only: no instruction text of theirs is kept
    assert not any(df[c].astype(str).str.contains(r"LDG|FADD|SHFL").any() for c in df.columns)


def test_the_facts_were_read_by_todays_walk():
    """peers.csv was written by the SASS walk that reads our kernels today: the walk's
    reading of a fixed disassembly is what the facts record. A change to the walk that
    reads code differently fails here until the facts are read again."""
    recorded = set(pd.read_csv(PEERS_CSV)["walk"].astype(str))
    today = walk_fingerprint(WALK_REFERENCE.read_text())
    assert recorded == {today}, (
        f"kernels/peers.csv was read by another SASS walk (fingerprint {', '.join(sorted(recorded))}, today's "
        f"{today}): read the peers' wheels again with `python scripts/peer_facts.py` (downloads about 1.6 GB)")


def test_the_walks_fingerprint_sees_what_the_walk_reads(monkeypatch):
    """The fingerprint follows what the walk reads, not its source text: a walk that gave
    every bag length one more latency gives another fingerprint; the same walk the same."""
    from characterize.kernels.sass import analyze

    text = WALK_REFERENCE.read_text()
    assert "chz_warp_kernel" in text and "checked_bags" in text
    today = walk_fingerprint(text)
    assert walk_fingerprint(text) == today
    real = analyze.nest_facts

    def one_more(*args):
        facts = real(*args)
        return facts and {**facts, "bags": [[L, lat + 1, ins] for L, lat, ins in facts["bags"]]}

    monkeypatch.setattr(analyze, "nest_facts", one_more)
    assert walk_fingerprint(text) != today


def test_each_peer_kernel_has_its_loop_nest():
    df = peer_facts()
    assert df["bag_latencies"].map(len).ge(5).all() and df["nest_rows_in_flight"].gt(0).all()


@pytest.mark.parametrize("D, lanes, d_max", [(128, 32, 128), (64, 16, 64), (32, 8, 32), (36, 16, 64),
                                            (256, 32, 256), (1024, 32, 1024)])
def test_fbgemm_serves_each_D_with_the_instance_its_host_code_picks(D, lanes, d_max):
    row = peer_kernel("fbgemm", "fp32", D, "sm_90")
    assert row["lanes_per_bag"] == lanes and row["D_max"] == d_max and row["D_min"] <= D


def test_layouts_are_read_from_the_template_arguments():
    assert fbgemm_layout("void split_embedding_codegen_forward_unweighted_kernel<float, float, float, false, long, "
                         "1ul, 32ul>(...)") == {"D_min": 65, "D_max": 128, "block_threads": 512, "lanes_per_bag": 32}
    assert fbgemm_layout("void torch_kernel<float>()") == {}


def test_what_the_facts_lack_is_refused_by_name():
    with pytest.raises(ConfigError, match="no kernel instance in the facts serves D=2000"):
        peer_kernel("fbgemm", "fp32", 2000, "sm_80")
    with pytest.raises(ConfigError, match="has no int8h kernel"):
        peer_kernel("torch", "int8h", 128, "sm_80")


def test_an_architecture_without_code_reads_the_closest():
    assert peer_kernel("torch", "fp32", 128, "sm_86")["arch"] == "sm_80"
    assert peer_kernel("torch", "fp32", 128, "sm_70")["arch"] == "sm_80"


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CHARACTERIZE_PEER_FACTS") != "1",
                    reason="downloads about 1 GB of wheels: set CHARACTERIZE_PEER_FACTS=1 to regenerate and compare")
def test_the_script_regenerates_the_committed_facts(tmp_path):
    out = tmp_path / "peers.csv"
    keep = os.environ.get("CHARACTERIZE_PEER_WHEELS")
    cmd = [sys.executable, str(ROOT / "scripts" / "peer_facts.py"), "--out", str(out)]
    subprocess.run(cmd + (["--keep", keep] if keep else []), check=True, timeout=3600)
    fresh, committed = pd.read_csv(out), pd.read_csv(PEERS_CSV)
    key = ["peer", "dtype", "arch", "symbol"]
    merged = committed.merge(fresh, on=key, suffixes=("", "_new"))
    assert len(merged) == len(committed) == len(fresh)
    for col in ("registers", "wheel_sha256", "nest_rows_in_flight", "bag_latencies", "walk"):
        assert (merged[col].astype(str) == merged[f"{col}_new"].astype(str)).all(), col
