import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "unit"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked `gpu` where no CUDA device is present (torch is imported only when one is collected)."""
    needing_cuda = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not needing_cuda:
        return
    import torch

    if torch.cuda.is_available():
        return
    for item in needing_cuda:
        item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
