"""The package's shape: stages as folders, imports one way, the shared vocabulary
defined once. These fail when a second copy or an upward import appears."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "characterize"
SOURCES = sorted(PKG.rglob("*.py"))


def _text(path: Path) -> str:
    return path.read_text()


def _code(path: Path) -> str:
    """The source without docstrings and comments: what the vocabulary checks read."""
    text = _text(path)
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            for i in range(body[0].lineno - 1, body[0].end_lineno):
                lines[i] = ""
    return "\n".join(re.sub(r"#.*$", "", ln) for ln in lines)


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install '.[test]')")
    r = subprocess.run([str(lint)], cwd=PKG.parent, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "BROKEN" not in r.stdout


def test_every_stage_is_one_folder():
    flat = sorted(p.stem for p in PKG.glob("*.py") if p.stem != "__init__")
    assert flat == ["config", "errors", "files", "memory", "progress", "rundir", "store", "toolchain", "units"]
    stages = {"hardware", "kernels", "workloads", "measure", "extract", "analysis", "report", "pipeline", "cli"}
    assert stages <= {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}


def test_the_cuda_sources_live_at_the_top_level_and_ship_in_the_wheel():
    """The product brief's top level: pyproject.toml, characterize, kernels, profiles,
    reports, notebooks, tests. The CUDA sources are kernels/, not package folders;
    setup.py maps them into the wheel as characterize.kernels.cuda."""
    root = PKG.parent
    assert {"pyproject.toml", "characterize", "kernels", "profiles", "reports", "notebooks", "tests"} <= \
        {p.name for p in root.iterdir()}
    sources = {p.name for p in (root / "kernels").iterdir()}
    assert {"embedding_bag.cu", "embedding_bag_backward.cu", "chz_compat.cuh", "chz_emulate.h"} <= sources
    assert not list(PKG.rglob("*.cu")) and not list(PKG.rglob("*.cuh"))
    setup = (root / "setup.py").read_text()
    assert '"characterize.kernels.cuda": "kernels"' in setup and '"*.cu", "*.cuh", "*.h"' in setup


def test_library_imports_its_own_modules_at_the_top():
    """Imports of characterize inside functions hide cycles; only the CLI defers them
    (for startup time, said once in its package docstring)."""
    offenders = []
    for path in SOURCES:
        if "cli" in path.relative_to(PKG).parts:
            continue
        for node in ast.walk(ast.parse(_text(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("characterize"):
                        offenders.append(f"{path.relative_to(PKG)}:{inner.lineno}")
    assert not offenders


def test_report_does_not_import_torch():
    code = "import sys, characterize.report.render; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


#: literals of the shared vocabulary and the one module allowed to spell each
VOCABULARY = {
    r"""["']one-item["'],\s*["']high["'],\s*["']medium["']""": {"workloads/presets.py"},
    r"""["']torch["'],\s*["']base["'],\s*["']optmt["']""": {"kernels/registry.py"},
    r"\b60_?000\b": {"workloads/locality.py"},
    r"""["']sm_80["'],\s*["']sm_90["']""": {"config.py"},
    r"up to \+103%|\b2\.03\b|\b1\.53\b": {"analysis/claims.py"},
}


@pytest.mark.parametrize("pattern", list(VOCABULARY))
def test_shared_vocabulary_is_written_once(pattern):
    found = {str(p.relative_to(PKG)) for p in SOURCES if re.search(pattern, _code(p))}
    assert found <= VOCABULARY[pattern], f"{pattern!r} also spelled in {sorted(found - VOCABULARY[pattern])}"


def test_the_reference_architecture_default_lives_in_hardware():
    """A bare 'sm_80' default belongs to hardware.REFERENCE_ARCH (the paper's A100)."""
    allowed = {"hardware/specs.py"}
    found = set()
    for p in SOURCES:
        for node in ast.walk(ast.parse(_text(p))):
            if isinstance(node, ast.arguments):
                defaults = [*node.defaults, *[d for d in node.kw_defaults if d is not None]]
                if any(isinstance(d, ast.Constant) and d.value == "sm_80" for d in defaults):
                    found.add(str(p.relative_to(PKG)))
    assert found <= allowed


@pytest.mark.parametrize("stage", ["workloads", "kernels", "measure", "extract", "analysis", "report", "hardware"])
def test_each_stage_is_named_by_its_folder_in_every_docstring(stage):
    """One word per stage: a module of kernels/ says 'Kernels stage', never 'Build stage'
    or 'Run stage', so a reader finds the folder from the docstring."""
    wrong = []
    for path in sorted((PKG / stage).rglob("*.py")):
        doc = ast.get_docstring(ast.parse(_text(path))) or ""
        if not doc.startswith(f"{stage.capitalize()} stage"):
            wrong.append(f"{path.relative_to(PKG)}: {doc.splitlines()[0] if doc else '(no docstring)'}")
    assert not wrong
