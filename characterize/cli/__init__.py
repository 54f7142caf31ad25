"""Command line: a click group of thin commands over the library, one module per
command group (static, workload, measure, results, model); `base` holds the group,
which turns domain errors (CharacterizeError) into one-line messages and exit codes,
and the shared option bundles.

Each command parses its options, calls one library function and prints. Commands
import their stage when invoked: the pipeline loads torch, numba and matplotlib
(about 4 s), which `characterize --help` should not wait for.
"""


from characterize.cli import e2e, measure, model, results, sass, static, workload  # noqa: F401  (registers the commands)
from characterize.cli.base import main

__all__ = ["main"]
