"""Analysis stage: comparisons of stored runs, the performance model, its calibration and
the paper's claims. Everything here takes tables as input; nothing compiles or measures."""
