"""``python -m specround``: the same command line as the ``specround`` console script."""

from specround.cli import main

main()
