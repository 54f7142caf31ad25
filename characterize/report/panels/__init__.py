"""Report stage, panels declared as data: one module per kind of source."""
