"""The Checkmate MILP: a backend-neutral sparse problem, its encoding from a graph, and solver adapters."""
