"""Measure stage: CUDA-event timing in a supervised worker and Nsight Compute profiling,
one point at a time into a run directory."""
