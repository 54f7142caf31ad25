"""Shared fixtures: GPU marker handling, fixture report location, a tiny workload."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from characterize.config import WorkloadConfig

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def fixtures_dir() -> Path:
    """../shared/fixtures/ncu beside the repository, or $CHARACTERIZE_NCU_FIXTURES."""
    env = os.environ.get("CHARACTERIZE_NCU_FIXTURES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "ncu"


@pytest.fixture
def ncu_fixtures() -> Path:
    d = fixtures_dir()
    if not d.is_dir() or not list(d.glob("*.ncu-rep")):
        pytest.skip(f"real Nsight Compute reports not found in {d} (they live beside the repository)")
    return d


@pytest.fixture
def tiny() -> WorkloadConfig:
    return WorkloadConfig.tiny()
