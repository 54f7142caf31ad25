"""The wheel carries everything it needs: kernel sources, templates and experiments
ship inside it, so `characterize build` and `characterize run quick` work from an
empty directory, with the package installed from the wheel and the repository out
of reach."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_repository(tmp_path):
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(wheels), str(ROOT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (wheel,) = wheels.glob("characterize-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # this pip installs
    vpy = venv / "bin" / "python"
    # Dependencies come from this environment's site-packages through a .pth file; the
    # editable install of the repository is not visible there (its own .pth is not read).
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps", "--no-index",
                        str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CHARACTERIZE_KERNELS")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = subprocess.run([str(vpy), "-c", "import characterize; print(characterize.__file__)"], cwd=empty,
                           env=env, capture_output=True, text=True, check=True).stdout
    assert str(venv) in where, where
    build = subprocess.run([str(venv / "bin" / "characterize"), "build", "--arch", "sm_80", "--variants", "base"],
                           cwd=empty, env=env, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    assert "chz_base_kernel" in build.stdout
    run = subprocess.run([str(venv / "bin" / "characterize"), "run", "quick", "--out", "out"], cwd=empty, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (empty / "out" / "report.html").is_file() and (empty / "out" / "predictions.csv").is_file()
