"""The README opens with the two commands, and CI runs the second one verbatim."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block and text.index("```bash") < 200, "the README must open with its commands"
    lines = [l for l in block.group(1).splitlines() if l.strip()]
    assert lines[0].startswith("# 1.") and lines[2].startswith("# 2.") and len(lines) == 4
    assert "characterize run" in lines[1] and "pytest" in lines[3]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "grep -A1 '^# 2\\. ' README.md" in ci and "eval" in ci


def test_the_supported_gpu_table_is_generated_from_the_spec_table():
    """Every GPU of hardware.specs is in docs/gpu.md's table, as the script writes it: a GPU
    added to the spec table fails this test until the table is regenerated."""
    import importlib.util
    import sys

    from characterize.hardware.specs import GPUS

    spec = importlib.util.spec_from_file_location("regenerate_doc_tables",
                                                  ROOT / "scripts" / "regenerate_doc_tables.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    text = mod.PAGE.read_text()
    assert mod.rendered(text) == text, "regenerate it: python scripts/regenerate_doc_tables.py"
    table = text[text.index(mod.BEGIN):text.index(mod.END)]
    for key, g in GPUS.items():
        assert f"| {g.name} | `{key}`" in table and f"| {g.arch}" in table, key
