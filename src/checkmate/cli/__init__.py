"""The `checkmate` command line: `main` dispatches to the subcommands (see `checkmate.cli.commands`)."""

from checkmate.cli.commands import main

__all__ = ["main"]
