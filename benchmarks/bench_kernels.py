"""Benchmark: the gather kernels side by side, for the paper configuration (T=12, E=500,000,
D=128, B=2048, L=150) and an L=1 configuration (T=10 x 1.7M rows, B=104,857, L=1), read from
their SASS for sm_80, sm_90 and sm_100 (no GPU needed; builds cached).

Prints, in one run:
  1. rows in flight per warp per variant, dtype and architecture: as `characterize sass` reads
     them (row loads in the hot loop alone), and for warp and tbe the rows a warp really gathers
     per memory latency over the whole loop nest of one bag at each configuration (the loop-nest
     replay of kernels.sass at that bag length, as the model reads it: index and offset loads
     that start a tile or a bag are waited on unless issued ahead; a short-path run of K bags is
     one stream of K x L rows), with the bytes those rows are, and registers and blocks per SM;
  2. napkin math per configuration and GPU: the bytes one batch gathers (every lookup's row),
     the bytes it moves at least (rows, indices, offsets, output), and those over the GPU's
     peak HBM bandwidth (hardware.specs): the time no kernel can beat, per batch and per table,
     and the launches a batch takes (T for the per-table variants, 1 for tbe);
  3. the model's prediction per configuration, GPU and variant (torch and fbgemm from their
     own SASS, warp and tbe from ours): time per batch of every table, the share of the no-reuse
     HBM roofline it reaches (the napkin time over the predicted one; above 100% when L2 hits save
     HBM traffic), and tbe against fbgemm.
"""

from __future__ import annotations

import time

from characterize.config import INDEX_BYTES, Pooling, WorkloadConfig, dtype_spec
from characterize.hardware.specs import gpu_spec
from characterize.kernels.registry import get_variant, tbe_group, tbe_vectors_per_lane, warp_group
from characterize.kernels.sass import interpolate
from characterize.kernels.static import analyze_variants, static_characterization
from characterize.units import format_bytes

ARCHS = ("sm_80", "sm_90", "sm_100")
GPUS = ("a100-80gb", "h100-sxm", "b200")   # one per architecture
DTYPES = ("fp32", "int8", "fp8")   # fp8 (e4m3) rows: tbe's alone
VARIANTS = ("base", "rpf", "warp", "tbe")
DTYPES_BYTES = {d: dtype_spec(d).element_bytes for d in DTYPES}
CONFIGS = {
    "paper": WorkloadConfig(T=12, E=500_000, D=128, B=2048, L=Pooling("fixed", 150.0)),
    "L=1": WorkloadConfig(T=10, E=1_700_000, D=128, B=104_857, L=Pooling("fixed", 1.0)),
}
#: tbe's two paths: the paper's bags take the long one, L=1 the short one (chosen per launch)
TBE_PATHS = {"tbe": {}, "tbe short": {"tbe": {"short": 1}}}


def hot_rows(row) -> float | None:
    """The hot loop's rows in flight as sass rows give them; an int8 or fp8 kernel whose row loads
    are 32 bits wide (tbe) is read with the same replay, its 32-bit gathers counted as rows (today's
    rows count them as a row's scale and bias, which tbe loads per tile, outside this loop)."""
    if row.rows_in_flight is not None:
        return row.rows_in_flight
    if dtype_spec(row.dtype).qparam_bytes and row.qparam_loads and row.latencies_per_iteration:
        return row.qparam_loads / row.latencies_per_iteration
    return None


def nest_rows(loop, label: str, config: WorkloadConfig, dtype: str) -> tuple[float, int] | None:
    """(rows a warp gathers per memory latency over one task at `config`'s bag length, the
    rows of that task) for warp and tbe, from the loop-nest replay's latencies per task
    (a short-path run of K = G - 1 one-row bags is one stream of K x L rows)."""
    if label not in ("warp", "tbe", "tbe short") or not loop.bag_latencies:
        return None
    L = config.L.mean
    if label == "tbe short":
        G = tbe_group(config.D, tbe_vectors_per_lane(config.D))
        length = (G - 1) * L
    else:
        G = warp_group(config.D, dtype) if label == "warp" else tbe_group(config.D, tbe_vectors_per_lane(config.D))
        length = L
    rows = length * (32 // G)
    return rows / interpolate(loop.bag_latencies, length), int(rows)


def kernel_table() -> list[dict]:
    out = []
    for dtype in DTYPES:
        for label, params in [(v, {}) for v in VARIANTS if v != "tbe"] + list(TBE_PATHS.items()):
            name = label.split()[0]
            if dtype not in get_variant(name).dtypes:
                continue
            loops = analyze_variants([name], ARCHS, params=params, dtype=dtype)
            static = {r.arch: r for r in static_characterization([name], ARCHS, params=params, dtype=dtype)
                      if r.role == "lookup"}
            row = {"variant": label, "dtype": dtype, "kernel": loops[0].kernel}
            for loop in (lp for lp in loops if lp.role == "lookup"):
                a = loop.arch
                row[f"{a} hot"] = hot_rows(loop)
                for cname, config in CONFIGS.items():
                    if label == "tbe short" and cname == "paper" or label == "tbe" and cname == "L=1":
                        continue    # the path a launch would not choose there
                    nest = nest_rows(loop, label, config, dtype)
                    if nest is not None:
                        rows = nest[0]    # rows really gathered, per latency
                        row[f"{a} {cname} nest"] = round(rows, 2)
                        row[f"{a} {cname} KB/warp"] = round(rows * config.D * DTYPES_BYTES[dtype] / 1024, 1)
                row[f"{a} regs/blocks"] = f"{static[a].registers}/{static[a].blocks_per_sm}"
            out.append(row)
    return out


def napkin_bytes(wl: WorkloadConfig) -> float:
    """Bytes one batch moves at least: every lookup's row, its index, the offsets and the fp32 output."""
    lookups = wl.T * wl.B * wl.L.mean
    return lookups * wl.row_bytes + lookups * INDEX_BYTES + wl.T * wl.B * (INDEX_BYTES + wl.D * 4)


def napkin(config: WorkloadConfig, dtype: str) -> dict:
    wl = config.replace(dtype=dtype)
    lookups = wl.T * wl.B * wl.L.mean
    gathered = lookups * wl.row_bytes
    moved = napkin_bytes(wl)
    row = {"dtype": dtype, "lookups/batch": int(lookups), "gathered/batch": format_bytes(gathered),
           "moved/batch": format_bytes(moved),
           "gathered/launch (per-table | tbe)": f"{format_bytes(gathered / wl.T)} | {format_bytes(gathered)}"}
    for key in GPUS:
        gpu = gpu_spec(key)
        us = moved / gpu.hbm_GBps / 1e3
        row[f"{key} us/batch"] = round(us, 1)
        row[f"{key} us/table"] = round(us / wl.T, 2)
    return row


def show(rows: list[dict]) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[("-" if r.get(c) is None else f"{r[c]:.2f}" if isinstance(r.get(c), float) else str(r[c]))
              for c in cols] for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, width)))
    for x in cells:
        print("  ".join(v.rjust(w) for v, w in zip(x, width)))


#: the datasets each configuration is predicted on: the paper's hardest and its medium one; Zipf 1.05 at L=1
PREDICTED = {"paper": ("random", "medium"), "L=1": ("zipf:1.05",)}
PEERS = ("torch", "fbgemm", "warp", "tbe")


def predictions_table() -> list[dict]:
    """The model per configuration, dataset, GPU and variant (fp32): batch time, % of the
    HBM roofline (bytes moved at least / peak bandwidth, over the predicted time)."""
    from characterize.analysis.model.predict import predict
    from characterize.pipeline import code_facts

    code = code_facts(["base", "warp", "tbe"], list(ARCHS), 128)
    out = []
    for cname, config in CONFIGS.items():
        wl = config.replace(batches=3)
        moved = napkin_bytes(wl)
        df = predict(wl, list(PREDICTED[cname]), list(PEERS), list(GPUS), static=code.static, sass=code.sass)
        for (ds, gpu), g in df.groupby(["dataset", "gpu"], sort=False):
            t = g.set_index("variant")["batch_us"]
            row = {"config": cname, "dataset": ds, "gpu": gpu}
            roof = moved / gpu_spec(gpu).hbm_GBps / 1e3
            for v in PEERS:
                row[f"{v} us/batch"] = round(float(t[v]), 1)
                row[f"{v} % no-reuse roof"] = round(100 * roof / float(t[v]), 1)
            row["tbe vs fbgemm"] = f"{float(t['fbgemm']) / float(t['tbe']):.2f}x"
            out.append(row)
    return out


def precision_table() -> list[dict]:
    """tbe at each precision on the paper configuration (every dataset PREDICTED names), on
    each GPU: batch time and % of the no-reuse HBM roofline at that dtype's row bytes."""
    from characterize.analysis.model.predict import predict
    from characterize.pipeline import code_facts

    out = []
    profiles: dict = {}   # the traces' locality, analyzed once for every dtype
    for dtype in DTYPES:
        code = code_facts([v for v in ("base", "tbe") if dtype in get_variant(v).dtypes], list(ARCHS), 128, dtype=dtype)
        wl = CONFIGS["paper"].replace(batches=3, dtype=dtype)
        moved = napkin_bytes(wl)
        df = predict(wl, list(PREDICTED["paper"]), ["tbe"], list(GPUS), static=code.static, sass=code.sass,
                     profiles=profiles)
        for (ds, gpu), g in df[df["variant"] == "tbe"].groupby(["dataset", "gpu"], sort=False):
            us = float(g["batch_us"].iloc[0])
            out.append({"dtype": dtype, "row bytes": wl.row_bytes, "dataset": ds, "gpu": gpu,
                        "moved/batch": format_bytes(moved), "tbe us/batch": round(us, 1),
                        "% no-reuse roof": round(100 * moved / gpu_spec(gpu).hbm_GBps / 1e3 / us, 1)})
    return out


#: the GPUs the work-order table predicts for
ORDER_GPUS = ("a100-80gb", "h100-sxm", "h200")
#: its targets: tbe's chosen order at least this much faster than warp on every paper dataset (H100, H200)
ORDER_TARGET = 1.05


def order_table() -> tuple[list[dict], list[str]]:
    """tbe's work order on the paper configuration (fp32), predicted: every table at once
    (the plain order, tables_in_flight = T), the order its launcher chooses from the trace
    (kernels.order), and warp (one table per launch), per dataset and GPU: us per table, DRAM
    bytes per table, and the ratios; with the misses of ORDER_TARGET said."""
    from characterize.analysis.model.predict import predict
    from characterize.pipeline import code_facts

    code = code_facts(["base", "warp", "tbe"], list(ARCHS), 128)
    wl = CONFIGS["paper"].replace(batches=3)
    out, misses = [], []
    profiles: dict = {}
    got = {}
    for label, params in (("plain", {"tbe": {"tables_in_flight": wl.T}}), ("chosen", {})):
        df = predict(wl, ["one-item", "high", "medium", "low", "random"], ["tbe", "warp"], list(ORDER_GPUS),
                     static=code.static,
                     sass=code.sass, params=params, profiles=profiles)
        got[label] = df.set_index(["dataset", "gpu", "variant"])
    for (ds, gpu, v), r in got["chosen"].iterrows():
        if v != "tbe":
            continue
        plain = got["plain"].loc[(ds, gpu, "tbe")]
        warp = got["chosen"].loc[(ds, gpu, "warp")]
        speedup = float(warp["time_per_table_us"]) / float(r["time_per_table_us"])
        out.append({"dataset": ds, "gpu": gpu, "tables in flight": int(r["tables_in_flight"]),
                    "plain us/table": round(float(plain["time_per_table_us"]), 1),
                    "chosen us/table": round(float(r["time_per_table_us"]), 1),
                    "warp us/table": round(float(warp["time_per_table_us"]), 1),
                    "plain DRAM/table": format_bytes(float(plain["dram_bytes"]) / wl.T),
                    "chosen DRAM/table": format_bytes(float(r["dram_bytes"]) / wl.T),
                    "chosen vs plain": f"{float(plain['time_us']) / float(r['time_us']):.2f}x",
                    "chosen vs warp": f"{speedup:.2f}x"})
        if gpu != "a100-80gb" and speedup < ORDER_TARGET:
            misses.append(f"{ds} on {gpu}: {speedup:.2f}x")
    return out, misses


def main() -> None:
    start = time.perf_counter()
    print(f"in flight per warp: row loads in the hot loop alone ('hot', as `characterize sass`); rows really "
          f"gathered per memory latency over one bag (or run of bags) of each configuration ('nest', index and "
          f"offset loads counted) and their KB; registers/blocks per SM; D=128, {', '.join(ARCHS)}:")
    show(kernel_table())
    for name, config in CONFIGS.items():
        print(f"\n{name}: T={config.T} E={config.E:,} D={config.D} B={config.B:,} L={config.L.mean:g} -- the time no "
              f"kernel beats: bytes moved per batch / peak HBM bandwidth (launches per batch: {config.T} per-table, "
              f"{get_variant('tbe').tables_per_launch or 1} tbe)")
        show([napkin(config, d) for d in DTYPES])
    print("\nthe model (PREDICTIONS, not measurements; fp32): time per batch of every table and the share of the "
          "no-reuse HBM roofline above it reaches (over 100% where L2 hits on reused rows save HBM traffic, as on "
          "the medium and Zipf traces); tbe against FBGEMM's TBE (read from fbgemm-gpu 1.8.0's own SASS):")
    show(predictions_table())
    print("\nthe model (PREDICTIONS): tbe at each precision on the paper configuration, against the roofline "
          "of that precision's bytes (int8: values + fp32 scale and bias; fp8: e4m3 values + an fp32 scale):")
    show(precision_table())
    rows, misses = order_table()
    print("\nthe model (PREDICTIONS): tbe's work order on the paper configuration, every table at once ('plain', "
          "what tbe ran before phases) against the order its launcher chooses from the trace, and warp; the DRAM "
          "bytes per table each order implies (its tables in flight share the L2); measured on an H200 in "
          "profiles/h200/tbe-order:")
    show(rows)
    print(f"target: tbe's chosen order >= {ORDER_TARGET:.2f}x warp on every paper dataset on H100 and H200: "
          + ("met" if not misses else "missed on " + ", ".join(misses)))
    print(f"\ndone in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
