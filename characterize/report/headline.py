"""Report stage, the first box of the page: the answer for each source, above everything
else. For a run: what to use per dataset and GPU, by how much, what limits it, the effect
on the whole step and how sure that is (analysis.answer, the same rows `characterize run`
and `predict` print). For an imported Nsight Compute file: the kernel that matters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from characterize.analysis import compare as analyze
from characterize.analysis import ncu
from characterize.analysis.answer import ModelValidation, answer_run
from characterize.report.blocks import Cell, TableBlock, fmt_num
from characterize.report.sources import ImportSource, Pair, RunSource
from characterize.report.views import first_answer


@dataclass
class AnswerBox:
    """One source's answer: a heading, sentences, and a table (empty for a report file)."""

    id: str
    title: str
    kind: str               # run | Nsight Compute report
    level: str              # measured | prediction | emulation | ncu | none
    sentences: list[str] = field(default_factory=list)
    table: TableBlock | None = None


def _cell(column: str, text: str) -> Cell:
    if column in ("GPU", "dataset", "best"):
        return Cell(text, "code")
    return Cell(text, "num" if column.startswith("vs ") or column == "end to end" else "")


def run_box(s: RunSource, validation: ModelValidation | None = None) -> AnswerBox:
    a = answer_run(s.run, validation)
    box = AnswerBox(f"{s.slug}-answer", s.label, "run", "none")
    if a.empty:
        box.sentences = ["No answer yet: this run holds neither GPU timings nor model predictions "
                         "(`characterize run` predicts without a GPU)."]
        return box
    box.level = "measured" if a.sources == ["measured"] else "prediction"
    rows = a.display_rows()
    columns = list(rows[0])
    box.table = TableBlock(columns, [[_cell(c, r[c]) for c in columns] for r in rows],
                           caption="The fastest variant per dataset: its speedup over each reference with the band "
                                   "in brackets, what limits it, and the whole DLRM inference step",
                           note="us/table: the best variant's time per table (a launch covering every table: its "
                                "time / T); us/batch: every table of a batch; vs X: X's time per table over the best "
                                "variant's (> 1: faster), from X's own row; bound: ncu's share of peak where the point "
                                "was profiled, else the model's term; tied within the band: variants the bands cannot "
                                "tell from the best (the speedup's band reaches 1x, or the measured confidence "
                                "intervals overlap)")
    box.sentences = [a.summary(), a.how(), *a.claim_lines()]   # provenance notes: the predictions table
    if s.emulated:
        box.sentences.append("The run's timings are CPU emulation: they check the harness and never answer this "
                             "question, so the answer above is the model's.")
    return box


def import_box(s: ImportSource) -> AnswerBox:
    box = AnswerBox(f"{s.slug}-answer", s.label, "Nsight Compute report", "ncu")
    k = s.kview_per_table.drop(index=ncu.without_data(s.kview).index)
    long = ncu.weighted_stalls(s.kview)
    tops = ncu.kernel_top_stalls(long)
    stalls = dict(zip(tops["kernel_id"], tops["top_stalls"])) if not tops.empty else {}
    text = first_answer(k, stalls) if not k.empty else ""
    box.sentences = [text or "The report holds no kernel with a duration: nothing to rank."]
    return box


def comparison_box(pair: Pair) -> AnswerBox | None:
    """Two Nsight Compute reports compared: how many kernels pair up, their summed time on
    each side and the largest change (None when a side has no profiled kernel)."""
    if not isinstance(pair.a, ImportSource) or not isinstance(pair.b, ImportSource):
        return None
    a, b = pair.a.kview_per_table, pair.b.kview_per_table   # per table when a run's points say so
    if a.empty or b.empty or "duration_ns" not in a.columns or "duration_ns" not in b.columns:
        return None
    kp = pair.kernel_pairs()   # as the comparison panels pair them, so the counts agree
    d = analyze.kernel_deltas(kp.a, kp.b, kp.matched, ["duration_ns"])
    d = d.dropna(subset=["a", "b"]) if not d.empty else d   # no kernel paired: no delta columns either
    box = AnswerBox(f"{pair.slug}-answer", pair.label, "comparison", "ncu")
    alone = len(kp.unmatched())
    if d.empty:
        box.sentences = [f"No kernel of {pair.b.label} pairs up with one of {pair.a.label} ({alone} on one side "
                         "only): pair them by hand with --pair A=B."]
        return box
    ta, tb = float(d["a"].sum()), float(d["b"].sum())
    top = d.reindex(d["delta"].abs().sort_values(ascending=False).index).iloc[0]
    change = (f"{top['a_kernel']} → {top['b_kernel']}: {fmt_num(top['a'] / 1e3)} µs → {fmt_num(top['b'] / 1e3)} µs "
              f"({top['delta_pct']:+.1f}%)")
    text = f"{pair.b.label} against {pair.a.label}: "
    if len(d) == 1:
        text += f"one kernel pairs up, {change}."
    else:
        text += (f"{len(d)} kernels pair up; their summed time goes from {fmt_num(ta / 1e3)} µs to "
                 f"{fmt_num(tb / 1e3)} µs ({100 * (tb - ta) / ta:+.1f}%); the largest change is {change}.")
    box.sentences = [text + (f" {alone} kernel(s) are on one side only (--pair A=B pairs them by hand)."
                             if alone else "")]
    return box


def answer_boxes(sources: list[Any], validation: ModelValidation | None = None,
                 pairs: list[Pair] = ()) -> list[AnswerBox]:
    """The first box of the page, one per source, in order, then one per comparison of two
    reports."""
    boxes = [run_box(s, validation) if isinstance(s, RunSource) else import_box(s) for s in sources]
    return boxes + [b for b in (comparison_box(p) for p in pairs) if b is not None]
