"""Kernels stage, peers: the kernels users run today, PyTorch's embedding bag and
FBGEMM's table-batched embedding (TBE), as facts read from their own machine code.

Why: "which technique, by how much" is asked against what a DLRM team runs, not
against the PyTorch 2.1 kernel our `base` reproduces. PyTorch's kernel changed in
2.10 (the index assert left the lookup loop: fewer registers, more resident warps),
and FBGEMM's TBE covers every table in one launch with a warp per bag. Their numbers
come from peers.csv, written by scripts/peer_facts.py from the wheels users install
(torch 2.13.0, fbgemm-gpu 1.8.0, CUDA builds), each row with its provenance: wheel
and its sha256, kernel symbol, cuobjdump version. Nothing of their code is here.

What the SASS cannot say, how each kernel is launched, is stated here from the peers'
host code (read, not copied):
- torch: `EmbeddingBag_updateOutputKernel_sum_mean` runs one warp per (bag, 32-feature
  chunk), lane = feature, blocks of 32 x 8 threads, a grid of 1024 blocks striding over
  the chunks; one launch per table. int8 tables go through the quantized operator's
  `embedding_bag_nbits_rowwise_offsets_kernel` (a thread per 4 columns).
- fbgemm: `split_embedding_codegen_forward_unweighted_kernel<emb, cache, out, false,
  long, kMaxVecsPerThread, kThreadGroupSize>` runs a group of kThreadGroupSize lanes per
  (table, bag), 512-thread blocks, div_round_up(T x B, 512 / group) blocks: all tables in
  one launch. Its host code picks the instance by the largest D (fbgemm_layout); int8
  tables use the inference kernels `nbit::INT8_..._small_L` (4 warps per block, two bags
  per warp).
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from characterize.errors import ConfigError
from characterize.hardware.specs import nearest_arch
from characterize.kernels.sass.analyze import analyze_kernel
from characterize.kernels.sass.parse import parse_sass

#: the peer releases the facts are read from: torch as the project pins it, and the fbgemm-gpu
#: release whose compatibility table names that torch (fbgemm-gpu 1.8 -> torch 2.13)
PEER_VERSIONS = {"torch": "2.13.0", "fbgemm": "1.8.0"}
PEERS_CSV = Path(__file__).resolve().parent / "peers.csv"


def walk_fingerprint(sass_text: str) -> str:
    """What the SASS analysis reads from a fixed disassembly (each kernel's rows in flight,
    and per bag length its latencies and instructions), digested. Why: peers.csv holds
    what the walk read from the peers' wheels when it was written; our own kernels are read
    afresh at every run. Recording this beside the facts (scripts/peer_facts.py) lets a test
    see when the walk has since changed what it reads, so the facts are read again rather
    than the peers and ours being predicted by two different walks."""
    facts = []
    for code in parse_sass(sass_text):
        r = analyze_kernel(code)
        if r is not None:
            facts.append([code.mangled, code.arch, r.rows_in_flight, r.nest_rows_in_flight, r.lanes_per_bag,
                          r.tile_lookups, r.setup_latencies, sorted(r.bag_latencies.items()),
                          sorted(r.bag_instructions.items())])
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


def fbgemm_layout(name: str) -> dict[str, int]:
    """The D an FBGEMM TBE forward instance serves, from its template arguments: its host
    code dispatches on the largest D to the instance of e elements per lane, the smallest
    of 1, 2, 4, 8, 12, 16, ... with D <= 32 e; kMaxVecsPerThread = max(e / 4, 1) and
    kThreadGroupSize = 32 / max(4 / e, 1) lanes per bag."""
    m = re.search(r"long, (\d+)ul, (\d+)ul>", name)
    if m:
        vecs, group = int(m.group(1)), int(m.group(2))
        e = {8: 1, 16: 2}.get(group, 4 * vecs)
        lower = {1: 0, 2: 32, 4: 64}.get(e, 32 * (e - 4))
        return {"D_min": lower + 1, "D_max": 32 * e, "block_threads": 512, "lanes_per_bag": group}
    m = re.search(r"nbit::\w+<long, \w+, (\d+)ul, (\d+)ul, (\d+)ul, (\d+)ul, (\d+)ul", name)
    if m:   # OutputRowsPerThread, WarpsPerBlock, InputRowsInFlight, Min/MaxNum128BRows: int8 rows of D + 4 bytes
        warps, lo, hi = int(m.group(2)), int(m.group(4)), int(m.group(5))
        return {"D_min": max(1, 128 * lo - 4 + 1), "D_max": 128 * hi - 4, "block_threads": 32 * warps,
                "lanes_per_bag": 32}
    return {}


@lru_cache(maxsize=1)
def peer_facts() -> pd.DataFrame:
    """Every peer kernel's facts, one row per (peer, dtype, instance, arch): the columns
    of a SASS row (kernels.sass.LoopRow; bag_latencies and bag_instructions as dicts)
    plus peer, version, dtype, symbol, registers, local_bytes, shared_mem, D_min, D_max,
    block_threads and the provenance wheel, wheel_sha256, library, sha256, cuobjdump.
    Empty when peers.csv is missing."""
    if not PEERS_CSV.is_file():
        return pd.DataFrame()
    df = pd.read_csv(PEERS_CSV)
    for col in ("bag_latencies", "bag_instructions", "load_bits"):
        if col in df.columns:
            df[col] = [json.loads(v) if isinstance(v, str) else {} for v in df[col]]
    return df


def peer_kernel(peer: str, dtype: str, D: int, arch: str) -> dict[str, Any]:
    """The facts of the kernel `peer` runs for tables of `dtype` and dimension D on a
    GPU of `arch` (its own code for that architecture, else the closest architecture's,
    hardware.specs.nearest_arch); ConfigError naming what peers.csv holds when it has none."""
    df = peer_facts()
    if df.empty:
        raise ConfigError(f"no facts of {peer}'s kernels ({PEERS_CSV} is missing); regenerate them with "
                          "`python scripts/peer_facts.py`")
    mine = df[(df["peer"] == peer) & (df["dtype"] == dtype)]
    if mine.empty:
        have = ", ".join(sorted(set(df.loc[df["peer"] == peer, "dtype"]))) or "none"
        raise ConfigError(f"{peer} {PEER_VERSIONS.get(peer, '')} has no {dtype} kernel in the facts (it has {have})")
    code_arch = nearest_arch(mine["arch"].astype(str), arch)   # none of its own: the closest that ships
    same = mine[mine["arch"] == code_arch]
    if {"D_min", "D_max"} <= set(same.columns) and same["D_min"].notna().any():
        fits = same[(same["D_min"] <= D) & (same["D_max"] >= D)]
        if fits.empty:
            raise ConfigError(f"{peer} {dtype}: no kernel instance in the facts serves D={D} "
                              f"(they serve D up to {int(same['D_max'].max())})")
        same = fits.sort_values("D_max")
    return same.iloc[0].to_dict()
