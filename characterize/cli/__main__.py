"""`python -m characterize.cli`: the same as the `characterize` command."""

from characterize.cli import main

main()
