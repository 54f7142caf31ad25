"""Analysis stage, the paper's claims: the MICRO 2024 A100 headlines, defined once, and
the model's predictions for the same configuration beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from characterize.analysis.model.constants import ModelConstants
from characterize.analysis.model.predict import predict
from characterize.config import WorkloadConfig
from characterize.hardware.specs import REFERENCE_ARCH, GpuSpec
from characterize.workloads.presets import HOTNESS_ORDER


@dataclass(frozen=True)
class Claim:
    """One published headline: what it measures, its value as a ratio, how it reads."""

    what: str
    ratio: float | None   # None: a qualitative claim
    text: str


#: the paper's published A100 claims (MICRO 2024), embedding stage and end to end
PAPER_CLAIMS: dict[str, Claim] = {
    "random_vs_one_item": Claim("embedding stage slowdown, random vs one-item (base)", 3.2,
                                "random access up to 3.2x slower than one-item"),
    "optmt": Claim("OptMT (register cap) speedup over base", 1.53, "up to +53% over the standard kernel (occupancy)"),
    "combined": Claim("combined (rpf + l2p, capped) speedup over base", 2.03,
                      "up to +103% over the standard kernel (RPF + L2P + OptMT)"),
    "l2p_hotness": Claim("L2 pinning helps more on hotter traces", None, "gain grows with hotness"),
    "end_to_end": Claim("combined speedup of the whole DLRM inference step", 1.77, "up to +77% end to end"),
}
#: the architecture and variants the claims were measured on (A100)
CLAIM_ARCH = REFERENCE_ARCH
CLAIM_VARIANTS = ("base", "optmt", "l2p", "combined")


# ------------------------------------------------------------ paper's claims
def paper_claims(workload: WorkloadConfig | None = None, gpu: str | GpuSpec = CLAIM_ARCH,
                 constants: ModelConstants | None = None, static: Any = None, sass: Any = None) -> pd.DataFrame:
    """The model against the MICRO 2024 paper's A100 claims (paper config on sm_80 by
    default). A ratio claim agrees when the model's gain (ratio - 1) is within 25% of
    the paper's; an 'up to' claim takes the model's best dataset."""
    wl = workload or WorkloadConfig.paper()
    df = predict(wl, list(HOTNESS_ORDER), list(CLAIM_VARIANTS), [gpu], constants=constants, static=static, sass=sass)
    t = df.pivot(index="dataset", columns="variant", values="time_us")
    s = df.pivot(index="dataset", columns="variant", values="speedup_vs_base")

    def close(model: float, paper: float) -> bool:
        return abs((model - 1) / (paper - 1) - 1) <= 0.25

    slow = t.loc["random", "base"] / t.loc["one-item", "base"]
    best = {v: (s[v].idxmax(), float(s[v].max())) for v in ("optmt", "combined")}
    hot = [d for d in reversed(HOTNESS_ORDER) if d != "one-item"]   # coldest to hottest
    gains = [float(s.loc[d, "l2p"]) for d in hot]
    monotone = all(b >= a - 1e-9 for a, b in zip(gains, gains[1:]))
    C = PAPER_CLAIMS
    rows = [
        _row("random_vs_one_item", "up to 3.2x", f"{slow:.2f}x", close(slow, C["random_vs_one_item"].ratio)),
        _row("optmt", "up to +53%", f"+{100 * (best['optmt'][1] - 1):.0f}% ({best['optmt'][0]})",
             close(best["optmt"][1], C["optmt"].ratio)),
        _row("combined", "up to +103%", f"+{100 * (best['combined'][1] - 1):.0f}% ({best['combined'][0]})",
             close(best["combined"][1], C["combined"].ratio)),
        _row("l2p_hotness", C["l2p_hotness"].text, ", ".join(f"{d} {g:.2f}x" for d, g in zip(hot, gains)), monotone),
    ]
    out = pd.DataFrame(rows)
    out["gpu"] = df["gpu"].iloc[0]
    out["constants"] = df["constants"].iloc[0]
    return out


def _row(key: str, paper: str, model: str, agrees: bool) -> dict[str, Any]:
    return {"claim": PAPER_CLAIMS[key].what, "paper": paper, "model": model, "agrees": agrees}


# ----------------------------------------------------- the claims, measured
def measured_claims(bench: pd.DataFrame, gpu: str, mode: str = "steady") -> pd.DataFrame:
    """The paper's claims on a run's own GPU, from its timings: per claim the paper's figure,
    the measured one (the best dataset for an "up to" claim) and whether it is reproduced
    (within 25% of the paper's gain, as the model's check) or not on this GPU. Reproducing
    an A100 claim on another GPU is a result either way. Rows only for claims whose
    variants the run timed. Columns: claim, paper, measured, reproduced, gpu."""
    if bench.empty or not {"variant", "dataset", "per_table_us"} <= set(bench.columns):
        return pd.DataFrame(columns=["claim", "paper", "measured", "reproduced", "gpu"])
    b = bench[bench.get("status", pd.Series("ok", index=bench.index)) == "ok"]
    if "mode" in b.columns:
        b = b[b["mode"] == mode]
    t = b.pivot_table(index="dataset", columns="variant", values="per_table_us", aggfunc="mean")

    def close(measured: float, paper: float) -> bool:
        return abs((measured - 1) / (paper - 1) - 1) <= 0.25

    C, rows = PAPER_CLAIMS, []
    if "base" in t.columns and {"random", "one-item"} <= set(t.index):
        slow = float(t.loc["random", "base"] / t.loc["one-item", "base"])
        rows.append(_measured("random_vs_one_item", "up to 3.2x", f"{slow:.2f}x", close(slow, 3.2)))
    for key, paper in (("optmt", "up to +53%"), ("combined", "up to +103%")):
        if {"base", key} <= set(t.columns):
            gain = (t["base"] / t[key]).dropna()
            if len(gain):
                ds, g = str(gain.idxmax()), float(gain.max())
                rows.append(_measured(key, paper, f"+{100 * (g - 1):.0f}% ({ds})", close(g, C[key].ratio)))
    hot = [d for d in reversed(HOTNESS_ORDER) if d != "one-item" and d in t.index]
    if {"base", "l2p"} <= set(t.columns) and len(hot) >= 2:
        gains = [float(t.loc[d, "base"] / t.loc[d, "l2p"]) for d in hot]
        rows.append(_measured("l2p_hotness", C["l2p_hotness"].text,
                              ", ".join(f"{d} {g:.2f}x" for d, g in zip(hot, gains)),
                              all(b2 >= a - 0.01 for a, b2 in zip(gains, gains[1:]))))
    out = pd.DataFrame(rows, columns=["claim", "paper", "measured", "reproduced"])
    out["gpu"] = gpu
    return out


def _measured(key: str, paper: str, measured: str, reproduced: bool) -> dict[str, Any]:
    return {"claim": PAPER_CLAIMS[key].what, "paper": paper, "measured": measured, "reproduced": reproduced}
