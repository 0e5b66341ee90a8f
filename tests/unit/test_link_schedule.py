"""The link's time model (`checkmate.link_schedule`), shared by the values moved to host memory and the fetched
values: its waits against a linear program of the same model (`oracles.least_waits`), by hand, and the fetched
values' instance against the closed form of `checkmate.fetched`'s module doc."""

from __future__ import annotations

import numpy as np
import pytest
from oracles import least_waits

from checkmate import link_schedule
from checkmate.fetched import FetchedValue, exposed_fetch_times
from checkmate.link_schedule import Copies


def _copies(work: list[float], first: list[int], last: list[int], column: list[int] | None = None) -> Copies:
    return Copies(
        np.array(work, dtype=np.float64),
        np.array(first, dtype=np.int64),
        np.array(last, dtype=np.int64),
        np.array(column if column is not None else list(range(len(work))), dtype=np.int64),
    )


def _random_lanes(rng: np.random.Generator, T: int, one_stage: bool) -> list[Copies]:
    lanes = []
    for _ in range(int(rng.integers(1, 3))):
        count = int(rng.integers(0, 5))
        first = rng.integers(0, T, count)
        last = first if one_stage else np.minimum(first + rng.integers(0, 3, count), T - 1)
        lanes.append(Copies(rng.random(count) * 3, first, last, rng.integers(0, 3, count)))
    return lanes


@pytest.mark.parametrize("seed", range(40))
def test_the_waits_are_the_least_any_schedule_allows(seed: int) -> None:
    """On random copies of one or two lanes (windows of 1-3 stages; every fifth case lent nothing), the schedule's
    total wait equals the linear program's least, and every copy is done within its window (the parts in `done` sum
    to the work per value)."""
    rng = np.random.default_rng(seed)
    T = int(rng.integers(1, 6))
    lanes = _random_lanes(rng, T, one_stage=seed % 2 == 0)
    lent = rng.random(T) * 2 * (seed % 5 != 0)
    work = link_schedule.schedule(lanes, lent, 3)
    jobs = [
        (lane, float(work), int(first), int(last))
        for lane, copies in enumerate(lanes)
        for work, first, last in zip(copies.work, copies.first, copies.last, strict=True)
    ]
    assert work.exposed.sum() == pytest.approx(least_waits(jobs, lent.tolist()), abs=1e-7)
    for copies, done in zip(lanes, work.done, strict=True):
        per_value = np.zeros(3)
        np.add.at(per_value, copies.column, copies.work)
        assert done.sum(axis=0) == pytest.approx(per_value)
        assert (done.sum(axis=1) <= lent + work.exposed + 1e-9).all()


@pytest.mark.parametrize("seed", range(20))
def test_one_stage_windows_take_the_stage_by_stage_schedule(seed: int) -> None:
    """The vectorised path for windows of one stage gives what the stage-by-stage schedule gives."""
    rng = np.random.default_rng(100 + seed)
    T = int(rng.integers(1, 8))
    lanes = _random_lanes(rng, T, one_stage=True)
    lent = rng.random(T) * 2
    fast = link_schedule._one_stage_windows(lanes, lent, 3)
    slow = link_schedule._earliest_deadline_first(lanes, lent, 3)
    assert fast.exposed == pytest.approx(slow.exposed)
    for ours, theirs in zip(fast.done, slow.done, strict=True):
        assert ours == pytest.approx(theirs)


def test_by_hand() -> None:
    """Stages lend 1 each. Lane 0: a copy of 2 in stages 0-1 and one of 2 in stages 1-2: the first (earlier
    deadline) takes stages 0 and 1, so the second has stage 2 only and the step waits 1 there. Lane 1, beside it: a
    copy of 1.5 in stage 2 would wait 0.5: the stage waits 1 (the longest lane's wait), not 1.5."""
    lent = np.ones(3)
    work = link_schedule.schedule([_copies([2.0, 2.0], [0, 1], [1, 2]), _copies([1.5], [2], [2])], lent, 2)
    assert work.exposed == pytest.approx([0.0, 0.0, 1.0])
    assert work.done[0][:, 0] == pytest.approx([1.0, 1.0, 0.0])
    assert work.done[0][:, 1] == pytest.approx([0.0, 0.0, 2.0])


def test_a_copy_needs_a_window() -> None:
    with pytest.raises(ValueError, match="window"):
        _copies([1.0], [2], [1])


@pytest.mark.parametrize("seed", range(20))
def test_the_fetched_values_are_an_instance(seed: int) -> None:
    """Fetched values priced through the link's model give the closed form of `checkmate.fetched`'s module doc: per
    stage t, max(0, the costs of the fetches of t - overlap x the compute of stage t - 1)."""
    rng = np.random.default_rng(200 + seed)
    T, count = int(rng.integers(2, 9)), int(rng.integers(1, 4))
    values = tuple(
        FetchedValue(f"v{k}", 8, (), float(rng.random() * 4), T - 1, T) for k in range(count)
    )  # presence is given: only the costs matter here
    presence = rng.random((T, count)) < 0.5
    compute = rng.random(T) * 3
    overlap = float(rng.choice([0.0, 0.5, 1.0]))
    before = np.vstack([np.zeros((1, count), dtype=bool), presence[:-1]])
    fetch_costs = (presence & ~before).astype(float) @ np.array([value.fetch_cost for value in values])
    closed_form = np.maximum(fetch_costs - overlap * np.concatenate([[0.0], compute[:-1]]), 0.0)
    assert exposed_fetch_times(values, presence, compute, overlap) == pytest.approx(closed_form)
