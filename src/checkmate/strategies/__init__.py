"""Built-in strategies; importing this package registers them."""

from checkmate.strategies import approx, checkpoint_all, chen, griewank, offload, optimal
from checkmate.strategies.registry import Strategy, get_strategy, strategies

__all__ = [
    "Strategy",
    "approx",
    "checkpoint_all",
    "chen",
    "get_strategy",
    "griewank",
    "offload",
    "optimal",
    "strategies",
]
