"""The committed example reports cannot go stale: each is rendered again from its
committed inputs and compared with the file (scripts/regenerate_examples.py --check),
and each screenshot must carry the hash of its report."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "regenerate_examples.py"


def _script():
    spec = importlib.util.spec_from_file_location("regenerate_examples", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_committed_examples_are_up_to_date(ncu_fixtures):
    problems = _script().check()
    assert not problems, "\n".join(problems) + "\nregenerate them with: python scripts/regenerate_examples.py"


def test_the_check_notices_a_changed_report(tmp_path):
    mod = _script()
    html = '<meta name="generator" content="characterize 0.1.0; matplotlib 3.11.2">\n<p>characterize 0.1.0</p>\n' \
           '<img src="data:image/png;base64,AAAA" width="800" height="300" alt="x">'
    assert mod.normalized(html, True) == mod.normalized(html.replace("0.1.0", "0.2.0"), True)  # version masked
    assert mod.normalized(html, False) == mod.normalized(html.replace("AAAA", "BBBB"), False)  # another matplotlib
    assert mod.normalized(html, True) != mod.normalized(html.replace("AAAA", "BBBB"), True)
    png = (Path(__file__).parents[2] / "reports" / "example-no-gpu.png").read_bytes()
    tagged = mod.png_with_text(png, "k", "v")
    assert mod.png_text(tagged)["k"] == "v" and tagged.startswith(b"\x89PNG")
