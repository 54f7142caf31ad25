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
