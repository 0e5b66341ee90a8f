"""`python -m checkmate` runs the command line."""

from checkmate.cli import main

raise SystemExit(main())
