"""The `checkmate` command line: `main` dispatches to the subcommands (see `checkmate.cli.main`)."""

from checkmate.cli.main import main

__all__ = ["main"]
