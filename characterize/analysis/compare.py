"""Analysis stage, comparisons: derived metrics and comparisons over stored runs.

Every function takes tidy DataFrames (from store.Run) and returns tidy DataFrames,
with units in derived column names. Speedup confidence intervals use the delta
method on the two means' relative CIs (independent samples).

Kernels compare per table: a batched kernel (tbe) walks every table of the batch in one
launch, so its duration, bytes and instruction counts are divided by the tables that
launch covers (`tables_per_launch`) before they stand beside a per-table kernel's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from characterize.analysis import ncu
from characterize.analysis.ncu import kernel_summary
from characterize.config import ExperimentConfig
from characterize.errors import (
    CharacterizeError,
    ConfigError,
    RunDirError,
    SlowerThanBaseline,
    did_you_mean,
    escape_text,
)
from characterize.extract.read import read_any
from characterize.extract.schema import short_function_name
from characterize.store import Run, load_run
from characterize.workloads.presets import HOTNESS_ORDER


def speedups(bench: pd.DataFrame, mode: str = "steady", against: Iterable[str] = ("base", "torch"),
             include_prepass: bool = False) -> pd.DataFrame:
    """Per (variant, dataset): per-table latency with its CI and the speedup over each
    reference variant (ratio of means; > 1 is faster), with a 95% CI."""
    if bench.empty:
        return pd.DataFrame()
    ok = bench[(bench["status"] == "ok") & (bench["mode"] == mode)].copy()
    t = "per_table_incl_prepass_us" if include_prepass else "per_table_us"
    ci = "ci95_incl_prepass_us" if include_prepass else "ci95_us"
    ok["latency_us"] = ok[t]
    ok["latency_ci95_us"] = ok[ci]
    cols = ["variant", "dataset", "mode", "latency_us", "latency_ci95_us", "effective_GBps", "hbm_pct",
            "prepass_per_table_us", "reps", "stable"]
    out = ok[[c for c in cols if c in ok.columns]].reset_index(drop=True)
    for ref in against:
        r = ok[ok["variant"] == ref][["dataset", "latency_us", "latency_ci95_us"]]
        r = r.rename(columns={"latency_us": "_ref", "latency_ci95_us": "_ref_ci"})
        m = out.merge(r, on="dataset", how="left")
        ratio = m["_ref"] / m["latency_us"]
        rel = np.sqrt((m["_ref_ci"] / m["_ref"]) ** 2 + (m["latency_ci95_us"] / m["latency_us"]) ** 2)
        out[f"speedup_vs_{ref}"] = ratio.values
        out[f"speedup_vs_{ref}_ci95"] = (ratio * rel).values
    return out


def headline(bench: pd.DataFrame, mode: str = "steady", reference: str = "base") -> pd.DataFrame:
    """Technique x hotness -> speedup over `reference` (rows: variants, columns: datasets)."""
    s = speedups(bench, mode, against=(reference,))
    if s.empty:
        return s
    table = s.pivot(index="variant", columns="dataset", values=f"speedup_vs_{reference}")
    order = [d for d in HOTNESS_ORDER if d in table.columns]
    return table[order + [c for c in table.columns if c not in order]]


def slowdown_random_vs_one_item(bench: pd.DataFrame, variant: str = "base", mode: str = "steady") -> float:
    """How much slower random access is than one-item for a variant (paper: up to 3.2x)."""
    s = bench[(bench["variant"] == variant) & (bench["mode"] == mode) & (bench["status"] == "ok")]
    by = dict(zip(s["dataset"], s["per_table_us"]))
    if "random" in by and "one-item" in by and by["one-item"] > 0:
        return float(by["random"] / by["one-item"])
    return math.nan


STALL_PREFIX = "stall_"


def stall_breakdown(kernels: pd.DataFrame) -> pd.DataFrame:
    """Long table: variant, dataset, reason, cycles per issued instruction (lookup kernels)."""
    if kernels.empty:
        return pd.DataFrame()
    stall_cols = [c for c in kernels.columns if c.startswith(STALL_PREFIX)]
    k = lookup_kernels(kernels)
    long = k.melt(id_vars=["variant", "dataset"], value_vars=stall_cols, var_name="reason", value_name="cycles")
    long["reason"] = long["reason"].str.removeprefix(STALL_PREFIX)
    return long.groupby(["variant", "dataset", "reason"], as_index=False)["cycles"].mean()


def lookup_kernels(kernels: pd.DataFrame) -> pd.DataFrame:
    """Profiled lookup kernels only (not the L2 pinning pre-pass)."""
    if kernels.empty or "function" not in kernels.columns:
        return kernels
    return kernels[~kernels["function"].astype(str).str.contains("l2_pin")]


#: the SM clock a profiled kernel ran at (ncu's SpeedOfLight "SM Frequency", in every metric set), in Hz
SM_CLOCK_METRIC = "gpc__cycles_elapsed.avg.per_second"


def bench_vs_ncu(run: Run, mode: str = "steady") -> pd.DataFrame:
    """Bench's durations beside Nsight Compute's, per table, per (variant, dataset, profiled
    launch) of a run that was benched and profiled. Columns: variant, dataset, table;
    bench_per_table_us (one event pair around the batch of T launches, / T),
    bench_per_launch_us (the per-launch diagnostic: one event pair around this table's
    launch, the launch front-end included); tables_per_launch (1, or T for a batched
    kernel); ncu_duration_us (gpu__time_duration of the lookup kernel / tables_per_launch:
    per table, as bench's, at the profile's clock policy); sm_frequency_MHz (ncu's SM clock
    for it); ncu_over_bench (x, ncu / bench per table). Empty when either side is missing."""
    points = [p for p in run.points("bench") if p.get("status") == "ok"]
    k = run.kernels
    if not points or k.empty or "duration_ns" not in k.columns:
        return pd.DataFrame()
    look = per_table_kernels(lookup_kernels(k), run)
    m = run.metrics
    clock = m[m["metric"] == SM_CLOCK_METRIC] if not m.empty and "metric" in m.columns else pd.DataFrame()
    rows = []
    for p in points:
        row = next((r for r in p.get("summary", []) if r.get("mode") == mode), None)
        if row is None:
            continue
        per_launch = (p.get("per_launch_table_us") or {}).get(mode) or []
        mine = look[(look["variant"] == p["variant"]) & (look["dataset"] == p["dataset"])]
        for t, g in mine.groupby("table"):
            tables = int(g["tables_per_launch"].iloc[0])
            ncu_us = float(g["duration_ns"].mean()) / 1e3   # per table already
            mine_clock = clock[clock["kernel_id"].isin(g["kernel_id"])] if not clock.empty else clock
            freq = float(mine_clock["value"].mean()) / 1e6 if not mine_clock.empty else float("nan")
            rows.append({"variant": p["variant"], "dataset": p["dataset"], "table": int(t),
                         "bench_per_table_us": row["per_table_us"],
                         "bench_per_launch_us": per_launch[int(t)] if int(t) < len(per_launch) else float("nan"),
                         "tables_per_launch": tables, "ncu_duration_us": ncu_us, "sm_frequency_MHz": freq,
                         "ncu_over_bench": ncu_us / row["per_table_us"] if row["per_table_us"] else float("nan")})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- per table
def _experiment_tables(run: Any) -> int | None:
    """T of the run's experiment (None when the run records none)."""
    exp = (getattr(run, "meta", None) or {}).get("experiment") or {}
    try:
        return int(ExperimentConfig.from_dict(exp).workload.T) if exp else None
    except (CharacterizeError, TypeError, ValueError):   # an older or foreign meta: its raw workload
        t = (exp.get("workload") or {}).get("T")
        return int(t) if isinstance(t, (int, float)) and t > 0 else None


def per_table_kernels(kernels: pd.DataFrame, run: Any) -> pd.DataFrame:
    """A run's kernels (one row per launch) per table, as every comparison reads them:
    ncu.per_table divides each launch's times, bytes and counts by the tables it covers
    (the profile point's tables_per_launch; for runs made before points recorded it, T of
    the experiment for a batched variant), and `per` says the unit ('table')."""
    if kernels.empty:
        return kernels
    return ncu.per_table(kernels, run.points("profile"), _experiment_tables(run)).assign(per="table")


def extensive_raw(metric: str) -> bool:
    """Whether a raw ncu metric is a launch's total (a `.sum` counter: bytes, sectors,
    instructions, gpu__time_duration.sum), to be divided per table."""
    return metric.endswith(".sum")


def compare_runs(a: pd.DataFrame, b: pd.DataFrame, keys: Iterable[str] = ("variant", "dataset", "function"),
                 value: str = "value", metric: str = "metric") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Metric-by-metric comparison of two tidy metric tables on the metrics they share.
    Returns (joined rows with a, b, delta and ratio; rows present on one side only)."""
    keys = [k for k in keys if k in a.columns and k in b.columns]
    agg_a = a.groupby(keys + [metric], dropna=False)[value].mean().rename("a")
    agg_b = b.groupby(keys + [metric], dropna=False)[value].mean().rename("b")
    joined = pd.concat([agg_a, agg_b], axis=1)
    both = joined.dropna(how="any").reset_index()
    both["delta"] = both["b"] - both["a"]
    both["ratio"] = both["b"] / both["a"].replace(0, np.nan)
    ka = a[keys].drop_duplicates()
    kb = b[keys].drop_duplicates()
    m = ka.merge(kb, how="outer", indicator=True)
    unmatched = m[m["_merge"] != "both"].rename(columns={"_merge": "only_in"})
    unmatched["only_in"] = unmatched["only_in"].map({"left_only": "a", "right_only": "b"})
    return both, unmatched.reset_index(drop=True)


# ------------------------------------------------------------ kernel matching
MATCH_EXACT = "name + launch order"
MATCH_MANUAL = "manual (--pair)"
MATCH_SIMILAR = "similar name + launch order"

_TRAILING = re.compile(r"(?:[_\-.]?v?\d+)+$", re.IGNORECASE)

#: how one side of a --pair reads, in the order a bare one is tried
SELECTOR_KINDS: tuple[str, ...] = ("id", "variant", "nvtx", "kernel")
#: how to name kernels, said with every refusal of a pair
PAIR_HELP = ("name a variant (base), variant/dataset (tbe/random), NVTX range (chz/base/random/0), function or "
             "demangled name, or #ID (tbe#0 where reports share IDs); id:, variant:, nvtx: or kernel: forces a reading")


def similar_name(name: str) -> str:
    """A kernel's base name without trailing version digits and case (nodeByPoint5 ->
    nodebypoint), for pairing kernels an application renamed between two reports."""
    n = short_function_name(str(name or ""))
    return _TRAILING.sub("", n).lower() or n.lower()


def parse_pairs(pairs: Iterable[str] | Mapping[str, str] | None) -> list[tuple[str, str]]:
    """`A=B` strings (or a mapping) as (a, b) selector pairs; refuses anything else."""
    if not pairs:
        return []
    if isinstance(pairs, Mapping):
        return [(str(a), str(b)) for a, b in pairs.items()]
    out = []
    for p in pairs:
        if isinstance(p, tuple):
            out.append((str(p[0]), str(p[1])))
            continue
        a, sep, b = str(p).partition("=")
        if not sep or not a.strip() or not b.strip():
            raise ConfigError(f"--pair {escape_text(str(p))!r}: give KERNEL_A=KERNEL_B; {PAIR_HELP}")
        out.append((a.strip(), b.strip()))
    return out


def _column(k: pd.DataFrame, c: str) -> pd.Series:
    """Column `c` of `k` as text ('' where the frame lacks it)."""
    return k[c].astype(str) if c in k.columns else pd.Series("", index=k.index, dtype=object)


@dataclass(frozen=True)
class KernelSelector:
    """One side of a --pair, like a kernel picked for Nsight Compute's baseline: which
    kernels of a source it designates. A bare text is read as the first of SELECTOR_KINDS
    that designates something (so `base` is the variant, `chz_base_kernel` the function);
    `kind:` forces a reading."""

    text: str
    kind: str = "auto"   # auto | one of SELECTOR_KINDS

    _ID = re.compile(r"(?:(?P<scope>[^#]*)#)?(?P<id>\d+)")

    @classmethod
    def parse(cls, spec: str) -> "KernelSelector":
        head, sep, rest = spec.partition(":")
        if sep and head in SELECTOR_KINDS and rest.strip():
            return cls(rest.strip(), head)
        return cls(spec.strip())

    def resolve(self, k: pd.DataFrame, where: str = "the source") -> tuple[pd.Series, str]:
        """(rows of `k` it designates, the reading that designated them; '' for none)."""
        for kind in (SELECTOR_KINDS if self.kind == "auto" else (self.kind,)):
            mask = getattr(self, f"_{kind}")(k, where)
            if mask.any():
                return mask, kind
        return pd.Series(False, index=k.index), ""

    def _variant(self, k: pd.DataFrame, where: str = "") -> pd.Series:
        v = _column(k, "variant")
        mask = v == self.text
        if "/" in self.text:
            variant, dataset = self.text.split("/", 1)
            mask |= (v == variant) & (_column(k, "dataset") == dataset)
        return mask & ("variant" in k.columns)

    def _nvtx(self, k: pd.DataFrame, where: str = "") -> pd.Series:
        r = _column(k, "nvtx_range")
        return ((r == self.text) | r.str.startswith(self.text.rstrip("/") + "/")) & ("nvtx_range" in k.columns)

    def _kernel(self, k: pd.DataFrame, where: str = "") -> pd.Series:
        func, full = _column(k, "function"), _column(k, "kernel_name")
        if "function" not in k.columns:
            return pd.Series(False, index=k.index)
        return (func == self.text) | (full == self.text) | (func.map(short_function_name) ==
                                                            short_function_name(self.text))

    def _report(self, k: pd.DataFrame) -> pd.Series:
        r = _column(k, "report")
        return (r == self.text) | (r.map(lambda x: Path(x).stem) == self.text)

    def _id(self, k: pd.DataFrame, where: str = "the source") -> pd.Series:
        m = self._ID.fullmatch(self.text)
        if m is None or "kernel_id" not in k.columns:
            return pd.Series(False, index=k.index)
        mask = pd.to_numeric(k["kernel_id"], errors="coerce") == int(m["id"])
        if m["scope"]:
            scope = KernelSelector(m["scope"])
            mask &= next((s for s in (scope._variant(k), scope._nvtx(k), scope._report(k)) if s.any()),
                         pd.Series(False, index=k.index))
        ident = [c for c in ("run", "report") if c in k.columns]
        reports = k.loc[mask, ident].drop_duplicates() if ident else pd.DataFrame()
        if len(reports) > 1:
            names = sorted({str(r) for r in reports["report"]}) if "report" in reports.columns else []
            raise ConfigError(f"--pair: {escape_text(self.text)!r} is kernel ID {m['id']} of {len(reports)} reports of "
                              f"{escape_text(where)} ({escape_text(', '.join(names))}); say which: "
                              f"{escape_text(Path(names[0]).stem if names else 'REPORT')}#{m['id']}, VARIANT#ID or "
                              "VARIANT/DATASET#ID")
        return mask


def _selectors(pairs: Iterable[str] | Mapping[str, str] | None) -> list[tuple[KernelSelector, KernelSelector]]:
    return [(KernelSelector.parse(x), KernelSelector.parse(y)) for x, y in parse_pairs(pairs)]


def _explode(k: pd.DataFrame, selectors: Sequence[KernelSelector], where: str) -> pd.DataFrame:
    """`k` with one row per (row, pair that designates it), `_pick` the pair's number, then
    the rows no pair designates once (`_pick` -1, left to automatic matching); `_row` is the
    row's label in `k`. A kernel may stand in several pairs (base=tbe and base=warp)."""
    parts, picked = [], pd.Series(False, index=k.index)
    for i, s in enumerate(selectors):
        mask, _ = s.resolve(k, where)
        parts.append(k[mask].assign(_pick=i))
        picked |= mask
    parts.append(k[~picked].assign(_pick=-1))
    parts = [p for p in parts if not p.empty] or [k.assign(_pick=-1)]
    out = pd.concat(parts)
    return out.assign(_row=out.index).reset_index(drop=True)


def check_pairs(pairs: Iterable[str] | Mapping[str, str] | None, a: Sequence[pd.DataFrame],
                b: Sequence[pd.DataFrame], a_name: str = "the first source", b_name: str = "the other sources") -> None:
    """ConfigError for a --pair A=B whose A designates nothing in any frame of `a` (kernels
    one row per launch, timed points) or whose B nothing of `b`: a pair that matches nothing
    would be silently ignored. The error lists what the side holds and a close name."""
    for x, y in parse_pairs(pairs):
        for name, frames, where in ((x, a, a_name), (y, b, b_name)):
            sel = KernelSelector.parse(name)
            if any(not f.empty and sel.resolve(f, where)[0].any() for f in frames):
                continue

            def have(c: str) -> list[str]:
                return sorted({str(v) for f in frames if not f.empty and c in f.columns for v in f[c].dropna()})
            funcs, variants, datasets = have("function"), have("variant"), have("dataset")
            funcs = [f for f in funcs if f != "(bench)"]
            listed = ", ".join(escape_text(h) for h in funcs[:8]) + (" ..." if len(funcs) > 8 else "")
            extra = (f"; variants: {escape_text(', '.join(variants))}" if variants else "") + \
                (f"; datasets: {escape_text(', '.join(datasets))}" if datasets else "")
            hint = did_you_mean(sel.text.split("/")[0].split("#")[0], variants + funcs)
            raise ConfigError(f"--pair {escape_text(x)}={escape_text(y)}: no kernel of {escape_text(where)} is "
                              f"{escape_text(name)!r} (its kernels: {listed or 'none profiled'}{extra}); {PAIR_HELP}."
                              + escape_text(hint))


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values([c for c in ("report", "kernel_id") if c in df.columns], kind="stable")


def _by_time(df: pd.DataFrame) -> pd.DataFrame:
    """Longest first (a pair given by hand matches the kernels that dominate each side)."""
    if "duration_ns" not in df.columns:
        return df
    return df.sort_values("duration_ns", ascending=False, kind="stable", na_position="last")


def _pair_rows(ga: pd.DataFrame, gb: pd.DataFrame, manual: bool) -> list[tuple[Any, Any, str]]:
    """(a label, b label, how) within one group: the same demangled base name in launch
    order, then a similar name; for a pair given by hand, what is left longest with longest
    (chz_base_kernel with chz_tbe_kernel). Leftovers are 'only in a' / 'only in b'."""
    used_a: set = set()
    used_b: set = set()
    out: list[tuple[Any, Any, str]] = []
    steps: list[tuple[str, Any]] = [(MATCH_EXACT, lambda s: s), (MATCH_SIMILAR, similar_name)]
    for how, name in steps + ([("time", None)] if manual else []):
        ra, rb = ga[~ga.index.isin(used_a)], gb[~gb.index.isin(used_b)]
        if ra.empty or rb.empty:
            break
        if name is None:
            batches = [(_by_time(ra), _by_time(rb))]
        else:
            na, nb = _column(ra, "function").map(name), _column(rb, "function").map(name)
            batches = [(ra[na == n], rb[nb == n]) for n in dict.fromkeys(na)]
        for sa, sb in batches:
            for ia, ib in zip(sa.index, sb.index):
                out.append((ia, ib, MATCH_MANUAL if manual else how))
                used_a.add(ia)
                used_b.add(ib)
    out += [(i, pd.NA, "only in a") for i in ga.index if i not in used_a]
    out += [(pd.NA, i, "only in b") for i in gb.index if i not in used_b]
    return out


def _groups(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str]) -> Iterator[tuple[pd.DataFrame, pd.DataFrame]]:
    """The rows of a and b sharing each value of `keys` (one group without keys)."""
    if not keys:
        yield a, b
        return

    def split(df: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
        return {(k if isinstance(k, tuple) else (k,)): g for k, g in df.groupby(list(keys), sort=False, dropna=False)}
    ga, gb = split(a), split(b)
    for key in dict.fromkeys([*ga, *gb]):
        yield ga.get(key, a.iloc[0:0]), gb.get(key, b.iloc[0:0])


def _aligned(sa: pd.DataFrame, sb: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    """Keys a pair given by hand is matched within: those whose values the two selections
    share while one spans several (base=tbe pairs dataset by dataset; base/random=tbe/medium
    pairs the two points)."""
    out = []
    for k in keys:
        va, vb = set(sa[k].dropna().astype(str)), set(sb[k].dropna().astype(str))
        if va & vb and (len(va) > 1 or len(vb) > 1):
            out.append(k)
    return out


def _key_value(ra: pd.Series | None, rb: pd.Series | None, k: str) -> Any:
    """A key of a matched row: the shared value, or 'a → b' where a pair given by hand
    crosses it (variant 'base → tbe')."""
    if ra is None or rb is None:
        return (rb if ra is None else ra).get(k)
    va, vb = ra.get(k), rb.get(k)
    return va if _same(va, vb) else f"{va} → {vb}"


def _match(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str], n_pairs: int, auto: bool) -> pd.DataFrame:
    """match_kernels on exploded frames (see _explode; unique row labels)."""
    a_s, b_s = _ordered(a), _ordered(b)
    rows: list[dict] = []

    def emit(ia: Any, ib: Any, how: str) -> None:
        ra = a.loc[ia] if pd.notna(ia) else None
        rb = b.loc[ib] if pd.notna(ib) else None
        rows.append({**{k: _key_value(ra, rb, k) for k in keys}, "a_index": ia, "b_index": ib, "match": how})

    for i in range(n_pairs):
        sa, sb = a_s[a_s["_pick"] == i], b_s[b_s["_pick"] == i]
        for ga, gb in _groups(sa, sb, _aligned(sa, sb, keys)):
            for r in _pair_rows(ga, gb, manual=True):
                emit(*r)
    if auto:
        for ga, gb in _groups(a_s[a_s["_pick"] == -1], b_s[b_s["_pick"] == -1], keys):
            for r in _pair_rows(ga, gb, manual=False):
                emit(*r)
    out = pd.DataFrame(rows, columns=[*keys, "a_index", "b_index", "match"])
    out["a_index"] = out["a_index"].astype("Int64")
    out["b_index"] = out["b_index"].astype("Int64")
    return out


def match_kernels(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str] = (),
                  pairs: Iterable[str] | Mapping[str, str] | None = None, auto: bool = True) -> pd.DataFrame:
    """Pair the kernels of two one-row-per-kernel frames.

    First the `pairs` given by hand (A=B, each side a KernelSelector: a variant, a
    variant/dataset, an NVTX range, a function or demangled name, a kernel ID), across
    groups: within each key value the two selections share (see _aligned); inside a pair
    the same name, a similar one, then longest with longest. Then, unless `auto` is False
    (a source compared with itself: only what was asked), the rest within each group of
    `keys` (e.g. variant, dataset for two runs): the same demangled base name, then a
    similar name (trailing version digits dropped: nodeByPoint5 ~ nodeByPoint); inside
    each name the i-th launch of A pairs with the i-th of B. Returns one row per pair or
    leftover kernel: a_index / b_index (row labels of `a` / `b`, <NA> on the side that
    lacks it), `match` (how it was paired, or 'only in a' / 'only in b') and the keys
    ('a → b' where a pair crosses one).
    """
    keys = [k for k in keys if k in a.columns and k in b.columns]
    sel = _selectors(pairs)
    ea = _explode(a, [x for x, _ in sel], "the first source")
    eb = _explode(b, [y for _, y in sel], "the second source")
    out = _match(ea, eb, keys, len(sel), auto)
    for side, e in (("a_index", ea), ("b_index", eb)):
        out[side] = pd.Series([e.at[i, "_row"] if pd.notna(i) else pd.NA for i in out[side]], index=out.index,
                              dtype="Int64")
    return out


def _labelled(k: pd.DataFrame, c: str) -> bool:
    return c in k.columns and k[c].fillna("").astype(str).ne("").any()


def _point_keys(ka: pd.DataFrame, kb: pd.DataFrame) -> list[str]:
    """variant/dataset when both sides carry them (two runs), else none (any report)."""
    return [c for c in ("variant", "dataset") if _labelled(ka, c) and _labelled(kb, c)]


def _launch_label(function: Any, launches: int, tables: Any) -> str:
    t = int(tables) if pd.notna(tables) and float(tables) > 1 else 1
    n = "1 launch" if launches == 1 else f"mean of {launches} launches"
    return f"{function} ({n}" + ("" if t == 1 else f", {t} tables each" if launches > 1 else f", {t} tables") + ")"


def average_launches(k: pd.DataFrame) -> pd.DataFrame:
    """A run's kernels one row per (variant, dataset, function): the mean launch (a run
    profiles the same kernel on several tables), `launches` counting them and `_launches`
    holding their row labels (`_row` where _explode set it); frames without variant and
    dataset (an imported report) keep one row per launch. A `_pick` column (the --pair
    that chose a launch) keeps what two pairs chose apart."""
    if k.empty:
        return k.assign(launches=pd.Series(dtype="int64"), _launches=pd.Series(dtype=object))
    rows_of = k["_row"] if "_row" in k.columns else pd.Series(k.index, index=k.index)
    if not (_labelled(k, "variant") and _labelled(k, "dataset")):
        return k.assign(launches=1, _launches=[(i,) for i in rows_of])
    keys = [c for c in ("run", "variant", "dataset", "function", "_pick") if c in k.columns]
    num = [c for c in k.columns if c not in keys and c not in ("kernel_id", "kid", "_row")
           and pd.api.types.is_numeric_dtype(k[c]) and not pd.api.types.is_bool_dtype(k[c])]
    rows = []
    for _, g in k.groupby(keys, sort=False, dropna=False):
        row = g.iloc[0].to_dict()
        row.update(g[num].mean().to_dict())
        if "kernel_id" in k.columns:
            row["kernel_id"] = g["kernel_id"].min()
        row["launches"], row["_launches"] = len(g), tuple(rows_of.loc[g.index])
        row["label"] = _launch_label(row.get("function"), len(g), row.get("tables_per_launch"))
        rows.append(row)
    return pd.DataFrame(rows, columns=list(dict.fromkeys([*k.columns, "label", "launches", "_launches"])))


@dataclass(frozen=True)
class KernelPairs:
    """Two sides' kernels ready to compare: `a` and `b` one row per compared kernel (a
    run's launches averaged, see average_launches), `matched` as match_kernels returns it
    (indexing a and b), `keys` the point keys it matched within."""

    a: pd.DataFrame
    b: pd.DataFrame
    matched: pd.DataFrame
    keys: tuple[str, ...]

    def unmatched(self) -> pd.DataFrame:
        """Kernels on one side only: keys, kernel (its label), only_in (a or b)."""
        def label(frame: pd.DataFrame, i: Any) -> Any:
            r = frame.loc[i]
            return r.get("label", r.get("function"))
        un = self.matched[self.matched["match"].str.startswith("only")]
        return pd.DataFrame([{**{k: r[k] for k in self.keys},
                              "kernel": label(self.a, r["a_index"]) if pd.notna(r["a_index"]) else
                              label(self.b, r["b_index"]), "only_in": r["match"][-1]} for r in un.to_dict("records")],
                            columns=[*self.keys, "kernel", "only_in"])


def pair_kernels(a: pd.DataFrame, b: pd.DataFrame, pairs: Iterable[str] | Mapping[str, str] | None = None, *,
                 auto: bool = True, where: tuple[str, str] = ("the first source", "the second source")
                 ) -> KernelPairs:
    """Kernels of two sources (one row per launch, with tables_per_launch for a run) paired
    as match_kernels does, on their mean launches: the --pair selectors are resolved on the
    launches first (an NVTX range or a kernel ID picks one table's launch), then each side's
    launches are averaged per variant, dataset, function and pair."""
    sel = _selectors(pairs)
    a = average_launches(_explode(a, [x for x, _ in sel], where[0])).reset_index(drop=True)
    b = average_launches(_explode(b, [y for _, y in sel], where[1])).reset_index(drop=True)
    keys = _point_keys(a, b)
    matched = _match(a, b, keys, len(sel), auto)
    return KernelPairs(a, b, matched, tuple(keys))


#: per-kernel columns compared between two sources, in reading order
KERNEL_DELTA_COLUMNS: tuple[str, ...] = (
    "duration_ns", "time_share_pct", "sm_throughput_pct", "memory_throughput_pct", "l1_throughput_pct",
    "l2_throughput_pct", "dram_throughput_pct", "achieved_occupancy_pct", "registers_per_thread",
    "l1_hit_rate_pct", "l2_hit_rate_pct", "dram_bytes_read", "dram_bytes_write", "inst_issued",
    "stall_long_scoreboard", "stall_barrier", "stall_wait", "stall_not_selected", "stall_math_pipe_throttle",
)


def _per(row: pd.Series) -> tuple[str, float]:
    """(the unit of a row's launch quantities, the tables its launch covers): 'table' for a
    run's kernels (per_table_kernels has divided them), else 'launch'."""
    if row.get("per") == "table":
        t = row.get("tables_per_launch")
        return "table", float(t) if t is not None and pd.notna(t) and float(t) > 0 else 1.0
    return "launch", 1.0


def kernel_deltas(a: pd.DataFrame, b: pd.DataFrame, matched: pd.DataFrame,
                  columns: Sequence[str] = KERNEL_DELTA_COLUMNS) -> pd.DataFrame:
    """Long table over matched kernel pairs: metric, per (the unit of a launch quantity,
    ncu.PER_LAUNCH: 'table' for a run's kernels, made per table by per_table_kernels,
    'launch' for a report's; '' for rates, percentages and per-instruction stalls), a, b,
    delta (b - a), delta_pct, and a_tables / b_tables (tables a launch covers). Single
    profiles carry no confidence interval, so no significance is claimed."""
    rows = []
    pairs = matched[matched["a_index"].notna() & matched["b_index"].notna()]
    keys = [c for c in matched.columns if c not in ("a_index", "b_index", "match")]
    for pair_no, m in enumerate(pairs.to_dict("records")):
        ra, rb = a.loc[m["a_index"]], b.loc[m["b_index"]]
        (ua, ta), (ub, tb) = _per(ra), _per(rb)
        for c in columns:
            if c not in a.columns or c not in b.columns:
                continue
            va, vb = ra.get(c), rb.get(c)
            if pd.isna(va) and pd.isna(vb):
                continue
            va, vb = float(va) if pd.notna(va) else np.nan, float(vb) if pd.notna(vb) else np.nan
            per = (ua if ua == ub else f"{ua} | {ub}") if c in ncu.PER_LAUNCH else ""
            rows.append({**{k: m[k] for k in keys}, "pair": pair_no, "match": m["match"],
                         "a_kernel": ra.get("label", ra.get("function")),
                         "b_kernel": rb.get("label", rb.get("function")), "a_tables": ta, "b_tables": tb,
                         "metric": c, "per": per, "a": va, "b": vb, "delta": vb - va,
                         "delta_pct": 100 * (vb - va) / abs(va) if va else np.nan})
    return pd.DataFrame(rows)


#: the metrics the report diffs each technique against base on (per table where extensive)
VERSUS_COLUMNS: tuple[str, ...] = ("duration_ns", "dram_bytes_read", "l2_hit_rate_pct", "achieved_occupancy_pct",
                                   "sm_throughput_pct", "dram_throughput_pct", "stall_long_scoreboard")


def versus_reference(kernels: pd.DataFrame, reference: str = "base",
                     columns: Sequence[str] = VERSUS_COLUMNS) -> pd.DataFrame:
    """Each profiled variant against `reference`, dataset by dataset, on the lookup kernels'
    mean launch per table (kernels: a run's, one row per launch, per_table_kernels;
    the L2 pinning pre-pass is left out, as bench's per-table latency leaves it out).
    kernel_deltas' long table plus `technique` (the variant compared); empty where the
    reference was not profiled on a dataset another variant was."""
    k = lookup_kernels(kernels)
    if k.empty or not (_labelled(k, "variant") and _labelled(k, "dataset")):
        return pd.DataFrame()
    ref_sets = set(k.loc[k["variant"] == reference, "dataset"].astype(str))
    frames = []
    for v in dict.fromkeys(k["variant"].astype(str)):
        ds = [d for d in dict.fromkeys(k.loc[k["variant"] == v, "dataset"].astype(str)) if d in ref_sets]
        if v == reference or not ds:
            continue
        kp = pair_kernels(k, k, [(f"variant:{reference}/{d}", f"variant:{v}/{d}") for d in ds], auto=False)
        d = kernel_deltas(kp.a, kp.b, kp.matched, columns)
        if not d.empty:
            frames.append(d.assign(technique=v))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ------------------------------------------------------------- table diffs
def significant(delta: float, ci_a: float, ci_b: float) -> bool | None:
    """Whether a difference of two independent means exceeds its 95% CI (None without CIs)."""
    if any(pd.isna(x) for x in (delta, ci_a, ci_b)) or math.isinf(ci_a) or math.isinf(ci_b):
        return None
    return bool(abs(delta) > math.hypot(ci_a, ci_b))


_BENCH_COLS = ("variant", "dataset", "mode", "per_table_us", "ci95_us")


def diff_bench(a: pd.DataFrame, b: pd.DataFrame, pairs: Iterable[str] | Mapping[str, str] | None = None,
               auto: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Timed points of two runs: per-table latency on both sides with CIs, delta (µs, %) and
    whether it is significant (95%). First each --pair whose sides name timed points (a
    variant or variant/dataset: base=tbe puts base beside tbe dataset by dataset and mode
    by mode; the variant column reads 'base → tbe'), then, unless `auto` is False, the rest
    joined on (variant, dataset, mode). Bench's latency is per table for every variant (a
    batched launch's batch / T), so nothing is divided here."""
    def ok(d: pd.DataFrame) -> pd.DataFrame:
        if d.empty or "status" not in d.columns:
            return pd.DataFrame(columns=list(_BENCH_COLS))
        d = d[d["status"] == "ok"]
        return d.reindex(columns=list(_BENCH_COLS)).reset_index(drop=True)

    sel = _selectors(pairs)
    A, B = _explode(ok(a), [x for x, _ in sel], "the first run"), _explode(ok(b), [y for _, y in sel], "the second run")
    both_frames, un_frames = [], []

    def join(sa: pd.DataFrame, sb: pd.DataFrame, on: list[str], how: str) -> None:
        m = sa.merge(sb, on=on, how="outer", suffixes=("_a", "_b"), indicator=True)
        for k in ("variant", "dataset"):
            if k not in on:   # a key the pair crosses: 'base → tbe'
                m[k] = [x if pd.isna(y) or x == y else y if pd.isna(x) else f"{x} → {y}"
                        for x, y in zip(m[f"{k}_a"], m[f"{k}_b"])]
        m["match"] = how
        both_frames.append(m[m["_merge"] == "both"])
        un = m[m["_merge"] != "both"]
        un_frames.append(un.assign(only_in=un["_merge"].map({"left_only": "a", "right_only": "b"}))
                         [["variant", "dataset", "mode", "only_in"]])

    for i in range(len(sel)):
        sa, sb = A[A["_pick"] == i], B[B["_pick"] == i]
        if not sa.empty and not sb.empty:
            join(sa, sb, [*_aligned(sa, sb, ("variant", "dataset")), "mode"], MATCH_MANUAL)
    if auto:
        join(A[A["_pick"] == -1], B[B["_pick"] == -1], ["variant", "dataset", "mode"], "same point")
    cols = ["variant", "dataset", "mode", "per_table_us_a", "ci95_us_a", "per_table_us_b", "ci95_us_b", "match"]
    both = pd.concat([f.reindex(columns=cols) for f in both_frames], ignore_index=True) if both_frames else \
        pd.DataFrame(columns=cols)
    both["delta_us"] = both["per_table_us_b"] - both["per_table_us_a"]
    both["delta_pct"] = 100 * both["delta_us"] / both["per_table_us_a"]
    both["significant"] = [significant(d, x, y) for d, x, y in
                           zip(both["delta_us"], both["ci95_us_a"], both["ci95_us_b"])]
    un = pd.concat(un_frames, ignore_index=True) if un_frames else \
        pd.DataFrame(columns=["variant", "dataset", "mode", "only_in"])
    return both, un.reset_index(drop=True)


@dataclass(frozen=True)
class SlowdownGate:
    """The regression gate of `compare A B --fail-if-slower PCT`: a point of B fails when
    its per-table latency exceeds A's by more than PCT percent of A's plus the 95% CI of the
    difference (sqrt(ci_a² + ci_b²)), so noise alone never fails a build. A point with an
    unknown CI is judged on its means; an infinite CI (one repetition) cannot be exceeded."""

    max_slowdown_pct: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.max_slowdown_pct) or self.max_slowdown_pct < 0:
            raise ConfigError(f"--fail-if-slower {self.max_slowdown_pct:g}: give a percentage >= 0 (5 allows 5% "
                              "slower)")

    def judge(self, bench: pd.DataFrame) -> pd.DataFrame:
        """diff_bench's joined points with allowed_us (the slowdown allowed: PCT of a plus
        the CI of the difference) and slower (delta_us > allowed_us)."""
        if bench.empty:
            return bench.assign(allowed_us=pd.Series(dtype=float), slower=pd.Series(dtype=bool))
        ci = np.hypot(bench["ci95_us_a"].astype(float).fillna(0.0), bench["ci95_us_b"].astype(float).fillna(0.0))
        allowed = self.max_slowdown_pct / 100 * bench["per_table_us_a"].astype(float) + ci
        return bench.assign(allowed_us=allowed, slower=bench["delta_us"].astype(float) > allowed)

    def check(self, bench: pd.DataFrame, a_name: str, b_name: str) -> pd.DataFrame:
        """The judged points; SlowerThanBaseline naming the slower ones, RunDirError when the
        two runs share no timed point (a gate that judged nothing must not pass)."""
        if bench.empty:
            raise RunDirError(f"--fail-if-slower: {a_name} and {b_name} share no timed point (same variant, dataset "
                              "and mode, or a --pair), so nothing can be judged; bench both runs")
        judged = self.judge(bench)
        bad = judged[judged["slower"]]
        if not bad.empty:
            def point(r: dict) -> str:
                ci = "" if pd.isna(r["ci95_us_a"]) or pd.isna(r["ci95_us_b"]) else \
                    f", 95% CIs ±{r['ci95_us_a']:.2g}/±{r['ci95_us_b']:.2g}"
                return (f"{r['variant']}, {r['dataset']}, {r['mode']}: {r['delta_pct']:+.1f}% "
                        f"({r['per_table_us_a']:.4g} → {r['per_table_us_b']:.4g} µs per table{ci})")
            listed = "; ".join(point(r) for r in bad.head(10).to_dict("records"))
            more = f"; and {len(bad) - 10} more" if len(bad) > 10 else ""
            raise SlowerThanBaseline(escape_text(
                f"{len(bad)} of {len(judged)} timed point(s) of {b_name} are more than {self.max_slowdown_pct:g}% "
                f"slower than {a_name} beyond the 95% CIs: {listed}{more}"))
        return judged


STATIC_KEYS = ("variant", "arch", "role", "maxrregcount", "sweep")
STATIC_VALUES = ("kernel", "registers", "spill_stores", "spill_loads", "stack_frame", "shared_mem", "blocks_per_sm",
                 "theoretical_occupancy_pct", "limiter")


def _table_diff(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str], values: Sequence[str]
                ) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """(rows whose values differ: key, column, a, b; rows on one side only; rows unchanged)."""
    keys = [k for k in keys if k in a.columns and k in b.columns]
    values = [v for v in values if v in a.columns and v in b.columns]
    if a.empty or b.empty or not keys:
        return pd.DataFrame(), pd.DataFrame(), 0

    def norm(d: pd.DataFrame) -> pd.DataFrame:
        d = d[keys + values].copy()
        for k in keys:
            d[k] = d[k].astype(str).str.lower().replace({"nan": "", "none": "", "1.0": "1", "0.0": "0"})
            d[k] = d[k].str.replace(r"\.0$", "", regex=True)
        return d.drop_duplicates(keys)

    m = norm(a).merge(norm(b), on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    both = m[m["_merge"] == "both"]
    changed, same = [], 0
    for r in both.to_dict("records"):
        diffs = [(v, r[f"{v}_a"], r[f"{v}_b"]) for v in values if not _same(r[f"{v}_a"], r[f"{v}_b"])]
        if not diffs:
            same += 1
        for v, x, y in diffs:
            changed.append({**{k: r[k] for k in keys}, "column": v, "a": x, "b": y,
                            "delta": (y - x) if _numeric(x) and _numeric(y) else np.nan})
    un = m[m["_merge"] != "both"][keys + ["_merge"]].rename(columns={"_merge": "only_in"})
    un["only_in"] = un["only_in"].map({"left_only": "a", "right_only": "b"})
    return pd.DataFrame(changed), un.reset_index(drop=True), same


def _numeric(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and not pd.isna(x)


def _same(x: object, y: object) -> bool:
    if pd.isna(x) and pd.isna(y):
        return True
    if _numeric(x) and _numeric(y):
        return math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-12)
    return str(x) == str(y)


def diff_static(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Static characterizations of two runs (two commits, two compilers): per (variant,
    arch, role, cap, sweep) the columns that changed, rows on one side only, rows unchanged."""
    return _table_diff(a, b, STATIC_KEYS, STATIC_VALUES)


SASS_KEYS = ("variant", "arch", "role", "kernel")
SASS_VALUES = ("instructions", "row_loads", "index_loads", "load_bits", "local_mem_ops", "latencies_per_iteration",
               "rows_in_flight", "bytes_in_flight_per_warp")


def diff_sass(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """SASS hot-loop tables of two runs: the columns that changed per (variant, arch, role, kernel)."""
    return _table_diff(a, b, SASS_KEYS, SASS_VALUES)


#: a prediction is one variant x dataset x GPU x mode at one precision (and, for the
#: cache variant, one cache size)
PREDICTION_KEYS = ("variant", "dtype", "dataset", "gpu", "mode", "cache_ratio")


def diff_predictions(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Model predictions of two runs joined on PREDICTION_KEYS: predicted
    time on both sides, delta (µs, %), and whether the change leaves the model's band
    (`outside_band`: b's time outside a's [time_us_low, time_us_high] or the reverse;
    None when either side has no band)."""
    keys = [k for k in PREDICTION_KEYS if k in a.columns and k in b.columns]
    if a.empty or b.empty or "time_us" not in a.columns or "time_us" not in b.columns or not keys:
        return pd.DataFrame(), pd.DataFrame()
    vals = [c for c in ("time_us", "time_us_low", "time_us_high", "speedup_vs_base", "l2_hit_rate_pct", "dram_bytes",
                        "bound", "loads_in_flight") if c in a.columns or c in b.columns]
    aa = a.reindex(columns=keys + vals).drop_duplicates(keys)
    bb = b.reindex(columns=keys + vals).drop_duplicates(keys)
    m = aa.merge(bb, on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    both = m[m["_merge"] == "both"].drop(columns="_merge").reset_index(drop=True)
    both["delta_us"] = both["time_us_b"] - both["time_us_a"]
    both["delta_pct"] = 100 * both["delta_us"] / both["time_us_a"]

    def outside(r: dict) -> bool | None:
        bands = [r.get(c) for c in ("time_us_low_a", "time_us_high_a", "time_us_low_b", "time_us_high_b")]
        if any(pd.isna(x) for x in bands):
            return None
        lo_a, hi_a, lo_b, hi_b = (float(x) for x in bands)
        return bool(not (lo_a <= r["time_us_b"] <= hi_a) or not (lo_b <= r["time_us_a"] <= hi_b))
    both["outside_band"] = [outside(r) for r in both.to_dict("records")]
    un = m[m["_merge"] != "both"][keys + ["_merge"]].rename(columns={"_merge": "only_in"})
    un["only_in"] = un["only_in"].map({"left_only": "a", "right_only": "b"})
    return both, un.reset_index(drop=True)


# -------------------------------------------------------------- two sources
def _sass_of(run: Run) -> pd.DataFrame:
    """The run's SASS hot-loop table."""
    return run.sass


def _open(source: str | Path) -> tuple[Run | None, pd.DataFrame]:
    """(the run or None, tidy ncu metrics) of a run directory or report file."""
    p = Path(source)
    if p.is_dir():
        run = load_run(p)
        return run, run.metrics
    return None, read_any(p, run=p.stem)


#: the workload fields whose change alone changes every time (seed and batches only resample)
SETUP_FIELDS = ("T", "E", "D", "B", "L", "dtype", "mode")


def setup_differences(a: str | Path, b: str | Path) -> list[str]:
    """What differs between two runs' setups: the workload in the field's vocabulary and
    the GPU. A comparison across them measures the change of setup as well as of the code,
    so `compare` says it first (empty for reports, which record neither)."""
    if not (Path(a).is_dir() and Path(b).is_dir()) or _same_source(a, b):
        return []
    ma, mb = load_run(a).meta, load_run(b).meta
    out = []
    wa, wb = (ma.get("experiment") or {}).get("workload") or {}, (mb.get("experiment") or {}).get("workload") or {}
    changed = [f"{k} {wa.get(k)} -> {wb.get(k)}" for k in SETUP_FIELDS if wa and wb and wa.get(k) != wb.get(k)]
    if changed:
        out.append("the two runs measured different workloads (" + ", ".join(changed) + "): every delta mixes "
                   "the workload's change with the code's")
    ga, gb = ((m.get("gpu") or {}).get("name") or (m.get("gpu") or {}).get("key") for m in (ma, mb))
    if ga and gb and ga != gb:
        out.append(f"the two runs ran on different GPUs ({ga} -> {gb}): every delta mixes the GPU's change with "
                   "the code's")
    return out


def _same_source(a: str | Path, b: str | Path) -> bool:
    """Whether both sides are one run or report (then only the pairs asked for compare:
    everything else would be compared with itself)."""
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def _bench_ok(run: Run | None) -> pd.DataFrame:
    if run is None or run.bench.empty or "status" not in run.bench.columns:
        return pd.DataFrame()
    return run.bench[run.bench["status"] == "ok"]


def _comparable(run: Run | None, m: pd.DataFrame) -> pd.DataFrame:
    frames = [m] if not m.empty else []
    ok = _bench_ok(run)
    if not ok.empty:
        frames.append(pd.DataFrame({"variant": ok["variant"], "dataset": ok["dataset"], "function": "(bench)",
                                    "kernel_id": -1, "metric": "bench." + ok["mode"] + ".per_table_us", "unit": "us",
                                    "value": ok["per_table_us"]}))
    if not frames:
        return pd.DataFrame(columns=["variant", "dataset", "function", "kernel_id", "metric", "unit", "value"])
    return pd.concat(frames, ignore_index=True)


def comparable_metrics(source: str | Path) -> pd.DataFrame:
    """Tidy metrics of a run directory (ncu metrics plus bench latencies as metrics named
    'bench.<mode>.per_table_us') or of any .ncu-rep / ncu CSV file."""
    return _comparable(*_open(source))


def _kernel_rows(run: Run | None, m: pd.DataFrame, bench: bool = False) -> pd.DataFrame:
    """One row per profiled launch (kernel_summary), per table for a run; with
    `bench`, one '(bench)' row per timed point too (its latencies are raw metrics)."""
    k = kernel_summary(m)
    if run is not None:
        k = per_table_kernels(k, run)
    ok = _bench_ok(run) if bench else pd.DataFrame()
    if not ok.empty:
        pts = ok[["variant", "dataset"]].drop_duplicates().assign(function="(bench)", kernel_id=-1)
        k = pd.concat([k, pts], ignore_index=True) if not k.empty else pts.reset_index(drop=True)
    return k


_LAUNCH_IDENT = ("run", "report", "kernel_id", "function", "variant", "dataset")


def _launch_metrics(m: pd.DataFrame, k: pd.DataFrame, launches: Sequence[Any]) -> pd.Series:
    """Raw metrics of the launches (row labels of `k`), averaged per metric."""
    frames = [_rows(m, k.loc[i], _LAUNCH_IDENT) for i in launches]
    rows = pd.concat(frames) if frames else m.iloc[0:0]
    return rows.groupby("metric")["value"].mean()


def compare_sources(a: str | Path, b: str | Path, metric_filter: str | None = None,
                    pairs: Iterable[str] | Mapping[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Metric-by-metric comparison of the kernels two runs or reports share, largest
    relative change first. Kernels are paired by `pair_kernels` (the `pairs` given by hand,
    base name and launch order, similar names; a run's launches averaged); a launch's
    totals (`.sum` counters: bytes, sectors, instructions, duration) are per table where
    the side knows its tables per launch (column per). Returns (shared: one row per kernel
    pair x raw metric with a, b, delta, ratio; unmatched kernels)."""
    run_a, ma = _open(a)
    run_b, mb = _open(b)
    ka, kb = _kernel_rows(run_a, ma, bench=True), _kernel_rows(run_b, mb, bench=True)
    check_pairs(pairs, [ka], [kb], str(a), str(b))
    xa, xb = _comparable(run_a, ma), _comparable(run_b, mb)
    if metric_filter:
        xa = xa[xa["metric"].str.contains(metric_filter, regex=False)]
        xb = xb[xb["metric"].str.contains(metric_filter, regex=False)]
    cols = ["function", "a_kernel", "b_kernel", "match", "metric", "per", "a", "b"]
    if ka.empty or kb.empty:
        return pd.DataFrame(columns=[*cols, "delta", "ratio"]), pd.DataFrame()
    kp = pair_kernels(ka, kb, pairs, auto=not (_same_source(a, b) and parse_pairs(pairs)), where=(str(a), str(b)))
    keys = list(kp.keys)
    frames = []
    for m in kp.matched[kp.matched["a_index"].notna() & kp.matched["b_index"].notna()].to_dict("records"):
        ra, rb = kp.a.loc[m["a_index"]], kp.b.loc[m["b_index"]]
        (ua, ta), (ub, tb) = _per(ra), _per(rb)
        sa = _launch_metrics(xa, ka, ra["_launches"]).rename("a")
        sb = _launch_metrics(xb, kb, rb["_launches"]).rename("b")
        j = pd.concat([sa, sb], axis=1).dropna(how="any").rename_axis("metric").reset_index()
        big = j["metric"].map(extensive_raw)
        j.loc[big, "a"] = j.loc[big, "a"] / ta
        j.loc[big, "b"] = j.loc[big, "b"] / tb
        j.insert(1, "per", np.where(big, ua if ua == ub else f"{ua} | {ub}", ""))
        for k in reversed(keys):
            j.insert(0, k, m[k])
        j.insert(len(keys), "function", ra["function"] if ra["function"] == rb["function"]
                 else f"{ra['function']} ~ {rb['function']}")
        j.insert(len(keys) + 1, "a_kernel", ra["kernel_id"])
        j.insert(len(keys) + 2, "b_kernel", rb["kernel_id"])
        j.insert(len(keys) + 3, "match", m["match"])
        frames.append(j)
    both = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*keys, *cols])
    both["delta"] = both["b"] - both["a"]
    both["ratio"] = both["b"] / both["a"].replace(0, np.nan)
    order = (both["ratio"] - 1).abs().sort_values(ascending=False, kind="stable").index
    un = kp.matched[kp.matched["a_index"].isna() | kp.matched["b_index"].isna()]
    unmatched = pd.DataFrame([{**{k: r[k] for k in keys},
                               **({"function": kp.a.loc[r["a_index"], "function"],
                                   "kernel_id": kp.a.loc[r["a_index"], "kernel_id"]} if pd.notna(r["a_index"]) else
                                  {"function": kp.b.loc[r["b_index"], "function"],
                                   "kernel_id": kp.b.loc[r["b_index"], "kernel_id"]}),
                               "only_in": "a" if pd.notna(r["a_index"]) else "b"} for r in un.to_dict("records")])
    return both.loc[order].reset_index(drop=True), unmatched


def _rows(m: pd.DataFrame, r: pd.Series, cols: Sequence[str]) -> pd.DataFrame:
    mask = pd.Series(True, index=m.index)
    for c in cols:
        if c in m.columns:
            v = r.get(c)
            mask &= (m[c] == v) | (m[c].isna() & pd.isna(v))
    return m[mask]


def compare_all(a: str | Path, b: str | Path, pairs: Iterable[str] | Mapping[str, str] | None = None
                ) -> dict[str, pd.DataFrame]:
    """Everything two sources (runs or reports) can be compared on, as named frames:
    kernels (key per-kernel metrics of matched kernels, per table: see kernel_deltas),
    unmatched_kernels, bench, unmatched_points, static, static_unmatched, predictions,
    predictions_unmatched, sass, sass_unmatched. A source compared with itself compares
    only the `pairs` asked for (base=tbe within one run), and not its static tables, SASS
    or predictions. Raises ConfigError for a pair that designates nothing, RunDirError
    when the two share nothing comparable."""
    run_a, ma = _open(a)
    run_b, mb = _open(b)
    out: dict[str, pd.DataFrame] = {}
    ka, kb = _kernel_rows(run_a, ma), _kernel_rows(run_b, mb)
    check_pairs(pairs, [ka, _bench_ok(run_a)], [kb, _bench_ok(run_b)], str(a), str(b))
    asked = bool(parse_pairs(pairs))
    auto = not (asked and _same_source(a, b))
    if not ka.empty and not kb.empty:
        kp = pair_kernels(ka, kb, pairs, auto=auto, where=(str(a), str(b)))
        out["kernels"] = kernel_deltas(kp.a, kp.b, kp.matched)
        out["unmatched_kernels"] = kp.unmatched()
    if run_a is not None and run_b is not None:
        out["bench"], out["unmatched_points"] = diff_bench(run_a.bench, run_b.bench, pairs, auto=auto)
        if auto:
            out["static"], out["static_unmatched"], same = diff_static(run_a.static, run_b.static)
            out["static_unchanged"] = pd.DataFrame({"rows": [same]})
            out["predictions"], out["predictions_unmatched"] = diff_predictions(run_a.predictions,
                                                                                run_b.predictions)
            out["sass"], out["sass_unmatched"], same = diff_sass(_sass_of(run_a), _sass_of(run_b))
            out["sass_unchanged"] = pd.DataFrame({"rows": [same]})
    compared = [k for k in ("kernels", "unmatched_kernels", "bench", "predictions")
                if not out.get(k, pd.DataFrame()).empty]
    compared += [k for k in ("static", "sass") if not out.get(k, pd.DataFrame()).empty
                 or int(out.get(f"{k}_unchanged", pd.DataFrame({"rows": [0]}))["rows"].iloc[0]) > 0]
    if not compared:
        raise RunDirError(f"{a} and {b} hold nothing to compare: " + (
            "no kernel or timed point pairs up as --pair asks" if asked else
            "no profiled kernel on either side, and no timed point, static row, SASS row or prediction on both "
            "sides"))
    return out
