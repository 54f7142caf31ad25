"""Extract stage: Nsight Compute output (`.ncu-rep` or CSV) into tidy pandas frames."""
