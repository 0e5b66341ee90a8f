"""Stage times: each timed block counts toward its stage inside a recording, and nothing outside one."""

from __future__ import annotations

import time

from checkmate.stage_times import Stage, count_capture, recording, timed


def test_a_recording_sums_each_stage_and_counts_captures() -> None:
    with recording() as times:
        count_capture()
        with timed(Stage.SOLVE):
            time.sleep(0.02)
        with timed(Stage.CAPTURE):
            time.sleep(0.01)
        with timed(Stage.SOLVE):
            time.sleep(0.02)
        count_capture()
    recorded = times()
    assert [stage for stage, _ in recorded.seconds] == [Stage.CAPTURE, Stage.SOLVE]  # in Stage order
    assert recorded.of(Stage.SOLVE) >= 0.04 and recorded.of(Stage.CAPTURE) >= 0.01
    assert recorded.of(Stage.NODE_COMPILE) == 0.0
    assert recorded.captures == 2
    assert recorded.total >= recorded.of(Stage.SOLVE) + recorded.of(Stage.CAPTURE)
    assert "2 captures" in str(recorded) and "solve 0.0" in str(recorded)


def test_a_stage_inside_another_counts_in_the_inner_one_only() -> None:
    with recording() as times, timed(Stage.FUSED_RUNS), timed(Stage.NODE_COMPILE):
        time.sleep(0.03)
    recorded = times()
    assert recorded.of(Stage.NODE_COMPILE) >= 0.03
    assert recorded.of(Stage.FUSED_RUNS) < 0.03


def test_nothing_is_recorded_outside_a_recording() -> None:
    with timed(Stage.SOLVE):
        count_capture()
    with recording() as times:
        pass
    assert times().seconds == () and times().captures == 0
