"""Built-in strategies; importing this package registers them."""

from checkmate.strategies import checkpoint_all, chen, griewank
from checkmate.strategies.registry import Strategy, get_strategy, strategies

__all__ = ["Strategy", "checkpoint_all", "chen", "get_strategy", "griewank", "strategies"]
