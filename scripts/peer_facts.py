"""Regenerate characterize/kernels/peers.csv: the machine-code facts of the embedding
kernels users run, PyTorch's and FBGEMM's, read from the wheels users install.

    python scripts/peer_facts.py [--out characterize/kernels/peers.csv] [--keep DIR]

Downloads the CUDA wheels of torch (the version the project pins) and of the
fbgemm-gpu release that pairs with it from PyPI (about 1 GB; `pip download`, isolated
from local wheel mirrors), takes the shared libraries holding the kernels out of them,
and runs `characterize sass --binary` (characterize.kernels.binary) on each kernel for
sm_80 and sm_90. The CSV keeps numbers and provenance only: wheel file names and
sha256, library sha256, kernel symbol, cuobjdump version, and the fingerprint of the
SASS walk that read them (kernels.peers.walk_fingerprint): run it again when that
fingerprint's test says the walk has changed. Nothing of the peers' code is kept. Takes
a few minutes (download, then about 2 s per architecture per library).
Not run by CI; tests/kernels/test_peers.py runs it with --slow and network access
when CHARACTERIZE_PEER_FACTS=1.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from characterize.kernels.binary import analyze_binary  # noqa: E402
from characterize.kernels.peers import PEER_VERSIONS, PEERS_CSV, fbgemm_layout, walk_fingerprint  # noqa: E402
from characterize.kernels.sass import find_cuobjdump  # noqa: E402

ARCHS = ("sm_80", "sm_90", "sm_100")
#: (peer, wheel requirement, library inside the wheel, dtype, demangled-name pattern)
KERNELS = (
    ("torch", "torch/lib/libtorch_cuda.so", "fp32", r"EmbeddingBag_updateOutputKernel_sum_mean<float, long>"),
    ("torch", "torch/lib/libtorch_cuda.so", "fp16", r"EmbeddingBag_updateOutputKernel_sum_mean<c10::Half, long>"),
    ("torch", "torch/lib/libtorch_cuda.so", "bf16",
     r"EmbeddingBag_updateOutputKernel_sum_mean<c10::BFloat16, long>"),
    ("torch", "torch/lib/libtorch_cuda.so", "int8", r"embedding_bag_nbits_rowwise_offsets_kernel<long, \(unsigned char\)8>"),
    ("fbgemm", "fbgemm_gpu/fbgemm_gpu_tbe_training_forward.so", "fp32",
     r"^void split_embedding_codegen_forward_unweighted_kernel<float, float, float, false, long, \d+ul, \d+ul>"),
    ("fbgemm", "fbgemm_gpu/fbgemm_gpu_tbe_training_forward.so", "fp16",
     r"^void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long, \d+ul, "
     r"\d+ul>"),
    ("fbgemm", "fbgemm_gpu/fbgemm_gpu_tbe_inference.so", "int8",
     r"^void nbit::INT8_split_embedding_codegen_forward_unweighted_kernel_small_L<long, float, (\d+ul, ){5}false, "
     r"false>"),
)
#: the columns peers.csv keeps: what the model reads, what a reader checks, and the provenance
KEEP = ("peer", "version", "dtype", "arch", "binary_arch", "kernel", "symbol", "registers", "local_bytes", "shared_mem",
        "stack", "D_min", "D_max", "block_threads", "lanes_per_bag", "tile_lookups", "row_loads", "index_loads",
        "lookups_per_iteration", "instructions_per_lookup", "load_bits", "row_load_bits", "local_mem_ops", "spills_in_nest",
        "rows_in_flight", "nest_rows_in_flight", "bag_latencies", "bag_instructions", "wheel", "wheel_sha256",
        "library", "sha256", "cuobjdump", "walk")
#: the fixed disassembly whose reading by the walk peers.csv records (kernels.peers.walk_fingerprint)
WALK_REFERENCE = ROOT / "tests" / "data" / "walk_reference.sass"
WHEELS = {"torch": f"torch=={PEER_VERSIONS['torch']}", "fbgemm": f"fbgemm-gpu=={PEER_VERSIONS['fbgemm']}"}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def download(requirement: str, into: Path) -> Path:
    """The CUDA wheel of `requirement` for CPython 3.11 on x86-64 Linux, from PyPI only."""
    into.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--only-binary=:all:",
           "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--index-url",
           "https://pypi.org/simple", "-d", str(into), requirement]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    name = requirement.split("==")[0].replace("-", "_")
    (wheel,) = [w for w in into.glob("*.whl") if w.name.lower().startswith(name)]
    if "+cpu" in wheel.name:
        raise SystemExit(f"{wheel.name} is a CPU build; the CUDA wheel is needed")
    return wheel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PEERS_CSV)
    ap.add_argument("--keep", type=Path, default=None, help="download and extract here (kept) instead of a temporary")
    args = ap.parse_args()
    start = time.perf_counter()
    tool = find_cuobjdump()
    walk = walk_fingerprint(WALK_REFERENCE.read_text())
    work = args.keep or Path(tempfile.mkdtemp(prefix="peer-facts-"))
    wheels = {peer: download(req, work / "wheels") for peer, req in WHEELS.items()}
    rows = []
    for peer, member, dtype, pattern in KERNELS:
        wheel = wheels[peer]
        lib = work / "lib" / member
        if not lib.is_file():
            with zipfile.ZipFile(wheel) as z:
                z.extract(member, work / "lib")
        for r in analyze_binary(lib, pattern, ARCHS, dtype=dtype):
            if r.loop is None:
                continue
            d = r.to_dict()
            layout = fbgemm_layout(r.kernel.name) if peer == "fbgemm" else {}
            for key in ("load_bits", "prefetches", "bag_latencies", "bag_instructions"):
                d[key] = json.dumps({str(k): v for k, v in d[key].items()}, sort_keys=True)
            rows.append({"peer": peer, "version": PEER_VERSIONS[peer], "dtype": dtype, **layout, **d,
                         "wheel": wheel.name, "wheel_sha256": sha256(wheel), "library": member,
                         "cuobjdump": tool.version, "walk": walk})
        print(f"{peer} {dtype}: {sum(1 for x in rows if x['peer'] == peer and x['dtype'] == dtype)} kernel(s) "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    for r in rows:   # the name up to its parameters: the template arguments say which instance
        r["kernel"] = r["kernel"].replace("(anonymous namespace)", "{anonymous}").split("(")[0] \
            .replace("{anonymous}", "(anonymous namespace)")
    columns = [c for c in dict.fromkeys(k for r in rows for k in r) if c in KEEP]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {len(rows)} kernel(s) to {args.out} in {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
