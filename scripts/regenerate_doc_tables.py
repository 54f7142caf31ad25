#!/usr/bin/env python
"""Regenerate the documentation's generated tables, or check that they are current.

    python scripts/regenerate_doc_tables.py           # rewrite them in docs/gpu.md
    python scripts/regenerate_doc_tables.py --check   # exit 1 when one is stale

The supported-GPU table comes from the spec table (characterize.hardware.specs), marked
"measured here" for each GPU with a measured run committed under profiles/; a GPU added
to the spec table appears once this runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from characterize.hardware.specs import markdown_table  # noqa: E402
from characterize.store import list_runs, load_run  # noqa: E402

BEGIN = "<!-- supported GPUs: generated from characterize.hardware.specs.markdown_table -->"
END = "<!-- end of supported GPUs -->"
#: the page that holds the table
PAGE = ROOT / "docs" / "gpu.md"


def measured_runs(root: Path = ROOT / "profiles") -> dict[str, str]:
    """GPU key -> committed run directory holding measured (CUDA-event) points."""
    out: dict[str, str] = {}
    for path in list_runs(root) if root.is_dir() else []:
        run = load_run(path)
        gpu = (run.meta.get("gpu") or {}).get("key")
        ok = [p for p in run.points("bench") if p.get("status") == "ok" and p.get("backend") != "emulate"]
        if gpu and ok:
            out.setdefault(gpu, str(path.relative_to(ROOT)))
    return out


def gpu_table() -> str:
    return markdown_table(measured_runs())


def rendered(readme: str) -> str:
    block = f"{BEGIN}\n{gpu_table()}\n{END}"
    return re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, readme, flags=re.S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    path = PAGE
    text = path.read_text()
    fresh = rendered(text)
    if args.check:
        if fresh != text:
            print("docs/gpu.md's supported-GPU table is stale: python scripts/regenerate_doc_tables.py",
                  file=sys.stderr)
            return 1
        return 0
    path.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
