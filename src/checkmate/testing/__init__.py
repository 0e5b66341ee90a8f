"""Oracles that tests and benchmarks check the package against, written independently of the code they check."""
