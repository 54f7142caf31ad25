"""Kernels stage: the variant registry, nvcc builds, static and SASS analysis, launching and
the correctness check against torch. The CUDA sources ship in `cuda/`."""
