"""Report stage: stored runs and Nsight Compute files into one self-contained HTML page."""
