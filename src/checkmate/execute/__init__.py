"""Execution: run a plan's schedule over a captured step, and measure the memory it really uses.

`prepare` compiles a Captured step into a Program; `run_schedule` runs a schedule over it as one Python function
generated for that schedule (`checkmate.execute.codegen`) and kept with the Program.
"""

from checkmate.execute.memory import PeakMeter, eager_peak, measure_peak, step_baseline, storage_bytes
from checkmate.execute.program import Program, StepOutputs, prepare, run_schedule

__all__ = [
    "PeakMeter",
    "Program",
    "StepOutputs",
    "eager_peak",
    "measure_peak",
    "prepare",
    "run_schedule",
    "step_baseline",
    "storage_bytes",
]
