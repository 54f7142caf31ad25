"""Workloads stage: hotness presets, index traces (generated or read) and their locality."""
