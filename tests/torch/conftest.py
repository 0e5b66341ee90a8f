from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def module_cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Plans and measures cached for one test module only (`pytestmark = pytest.mark.usefixtures(...)`); Inductor
    keeps its own compile cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield
