"""`python -m prunelab ...`: the same as the `prunelab` command."""

from prunelab.cli import main

if __name__ == "__main__":
    main()
