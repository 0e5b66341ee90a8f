from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def module_cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Plans and measures cached for one test module only (`pytestmark = pytest.mark.usefixtures(...)`); Inductor
    keeps its own compile cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Dynamo's compiled code and caches cleared around the test, so no test runs another's compiled regions."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_timing_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    """No choice by measured time (`checkmate.inductor.choice.saves_enough`): every node Inductor compiles runs as
    its function and every run of the schedule that fits the plan is fused, however a busy machine's timings fall,
    for tests of what the functions and fused runs do."""
    monkeypatch.setattr("checkmate.inductor.choice.MIN_SAVING", float("inf"))
