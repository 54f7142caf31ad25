"""Hardware stage: the spec table (specs) and the GPUs present (devices)."""
