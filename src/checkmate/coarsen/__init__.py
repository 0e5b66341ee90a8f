"""Coarsen, solve, expand: plan a large graph through a smaller one (pure core, no torch).

    partition = choose_partition(graph, max_nodes=150)      # contiguous runs of nodes, one phase each
    coarsening = coarsen(graph, partition)                    # the coarse Graph, with conservative memory
    S = expand_checkpoints(coarsening, coarse_plan.S, coarse_plan.R)   # checkpoints on the full graph

A coarse plan maps to a plan on the full graph (`cheapest_r` of the expanded checkpoints) that costs no more and
peaks no higher than the coarse plan; every expanded plan still goes through the simulator.
"""

from checkmate.coarsen.coarse_graph import Coarsening, coarsen
from checkmate.coarsen.expand import expand_checkpoints, expand_plan
from checkmate.coarsen.partition import Partition, choose_partition

__all__ = ["Coarsening", "Partition", "choose_partition", "coarsen", "expand_checkpoints", "expand_plan"]
