"""Packaging beside pyproject.toml for one thing it cannot say declaratively: the CUDA
sources live in the top-level kernels/ folder of the repository and ship inside the
wheel as the package data characterize.kernels.cuda (characterize.kernels.build.kernels_dir)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["characterize", "characterize.*"]), "characterize.kernels.cuda"],
    package_dir={"characterize.kernels.cuda": "kernels"},
    package_data={"characterize.kernels.cuda": ["*.cu", "*.cuh", "*.h"],
                  "characterize.report": ["templates/*"], "characterize": ["experiments/*.toml"],
                  # the peers' kernel facts, and the corpus of public measurements with the model's error on it
                  "characterize.kernels": ["peers.csv"],
                  "characterize.analysis.model": ["measurements.csv", "measured_here.csv", "validation.csv",
                                                  "validation_here.csv", "model_error.json"]},
)
