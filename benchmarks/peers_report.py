"""Tables and the Pareto plot of `benchmarks/peers.py`, from its rows (also usable on a saved JSON file).

.venv/bin/python benchmarks/peers.py --from-json benchmarks/results/peers.json --plot docs/peers.png
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from checkmate.files import write_figure

MIB = 2**20
MONOTONE_TOLERANCE = 0.01  # a smaller budget may read up to 1 % higher before we call the curve non-monotone
MATCH_TOLERANCE = 0.01  # ours "fits" a peer's level when its measured peak is at most 1 % above the peer's
PEER_ORDER = ("eager", "checkpoint", "SAC", "torch.compile")


@dataclass
class Row:
    """One configuration of one tool on one model, as measured (one meter for all tools)."""

    model: str
    tool: str
    config: str
    knob: float | None = None
    budget: int | None = None
    predicted_peak: int | None = None
    measured_peak: int | None = None
    own_meter_peak: int | None = None
    step_ms: float | None = None
    step_ms_min: float | None = None
    predicted_ms: float | None = None
    setup_s: float | None = None
    solve_s: float | None = None
    grads_equal: bool | None = None
    grads_bitwise: bool = False
    grad_error: float | None = None
    saved_activation_bytes: int | None = None
    matched: list[str] | None = None
    status: str | None = None
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.tool}: {self.config}"

    @property
    def is_ours(self) -> bool:
        return self.tool.startswith("ours")

    def short(self) -> str:
        return (
            f"{self.model} | {self.label} | peak {_mib(self.measured_peak)} | {_ms(self.step_ms)} | "
            f"grads {_grads(self)} {self.note}"
        )


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / MIB:.2f}"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _grads(row: Row) -> str:
    if row.grads_equal is None:
        return ""
    if row.grads_bitwise:
        return "yes (bitwise)"
    verdict = "yes" if row.grads_equal else "**NO**"
    return f"{verdict} ({row.grad_error:.1e})"


def main_table(rows: Sequence[Row]) -> str:
    lines = [
        "| model | tool | configuration | predicted peak MiB | measured peak MiB | step ms (median) | setup s "
        "(solve s) | grads = eager (max rel. err) | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        predicted = _mib(row.predicted_peak)
        if row.saved_activation_bytes is not None:
            predicted = f"(saves {_mib(row.saved_activation_bytes)})"
        setup = _seconds(row.setup_s) + (f" ({row.solve_s:.1f})" if row.solve_s is not None else "")
        note = row.note or (row.status or "")
        lines.append(
            f"| {row.model} | {row.tool} | {row.config} | {predicted} | {_mib(row.measured_peak)} | "
            f"{_ms(row.step_ms)} | {setup} | {_grads(row)} | {note} |"
        )
    return "\n".join(lines)


def ratio_rows(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """For each peer configuration, ours at the budget of its measured peak: step-time ratio and peak ratio."""
    by_label = {(row.model, row.label): row for row in rows}
    result: list[dict[str, Any]] = []
    for row in rows:
        if not row.is_ours or not row.matched:
            continue
        for label in row.matched:
            peer = by_label.get((row.model, label))
            if peer is None or peer.measured_peak is None:
                continue
            entry: dict[str, Any] = {"model": row.model, "peer": peer, "method": row.tool, "ours": row}
            if row.step_ms and peer.step_ms:
                entry["time_ratio"] = row.step_ms / peer.step_ms
            if row.measured_peak:
                entry["peak_ratio"] = row.measured_peak / peer.measured_peak
            result.append(entry)
    return result


def ratio_table(rows: Sequence[Row]) -> str:
    entries = ratio_rows(rows)
    methods = sorted({entry["method"] for entry in entries})
    grouped: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    peers: dict[tuple[str, str], Row] = {}
    for entry in entries:
        key = (entry["model"], entry["peer"].label)
        grouped[key][entry["method"]] = entry
        peers[key] = entry["peer"]
    header = "| model | peer (configuration) | peer peak MiB | peer ms |"
    rule = "|---|---|---|---|"
    for method in methods:
        header += f" {method}: peak MiB (vs peer) | ms | time ours/peer |"
        rule += "---|---|---|"
    lines = [header, rule]
    for key, by_method in grouped.items():
        peer = peers[key]
        line = f"| {key[0]} | {key[1]} | {_mib(peer.measured_peak)} | {_ms(peer.step_ms)} |"
        for method in methods:
            if method not in by_method:
                line += " | | |"
                continue
            entry = by_method[method]
            ours = entry["ours"]
            if ours.measured_peak is None:
                line += f" {ours.note} | | |"
                continue
            over = ", over" if entry.get("peak_ratio", 0) > 1 + MATCH_TOLERANCE else ""
            peak = f"{_mib(ours.measured_peak)} ({entry.get('peak_ratio', math.nan) - 1:+.1%}{over})"
            ratio = entry.get("time_ratio")
            line += f" {peak} | {_ms(ours.step_ms)} | {'' if ratio is None else f'{ratio:.2f}'} |"
        lines.append(line)
    return "\n".join(lines)


def ratio_summary(rows: Sequence[Row]) -> str:
    """Geometric mean of ours/peer step time per peer tool, over the levels where ours fit the peer's peak. Every level
    counts: the table says of how many levels that mean is, and names the levels where ours has no plan (or ran
    over the peer's peak) instead of leaving them out unsaid."""
    buckets: dict[tuple[str, str], list[float]] = defaultdict(list)
    levels: dict[tuple[str, str], int] = defaultdict(int)
    over: dict[tuple[str, str], int] = defaultdict(int)
    missing: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for entry in ratio_rows(rows):
        key = (entry["method"], entry["peer"].tool)
        levels[key] += 1
        if "time_ratio" not in entry:
            missing[key][entry["model"]].append(_mib(entry["peer"].measured_peak))
        elif entry.get("peak_ratio", 0) > 1 + MATCH_TOLERANCE:
            over[key] += 1
        else:
            buckets[key].append(entry["time_ratio"])
    lines = [
        "| ours | peer tool | levels where ours fit, of all | geo. mean time ours/peer | best | worst | levels where "
        "ours read over the peer's peak | levels where ours has no plan (peer peak MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(levels):
        ratios = buckets.get(key, [])
        mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else math.nan
        best = f"{min(ratios):.2f}" if ratios else ""
        worst = f"{max(ratios):.2f}" if ratios else ""
        absent = "; ".join(f"{model}: {', '.join(peaks)}" for model, peaks in missing[key].items()) or "none"
        lines.append(
            f"| {key[0]} | {key[1]} | {len(ratios)} of {levels[key]} | {mean:.2f} | {best} | {worst} | "
            f"{over.get(key, 0)} | {absent} |"
        )
    return "\n".join(lines)


def monotonicity_table(rows: Sequence[Row]) -> str:
    """For each tool driven by a budget: does the measured peak fall as the budget falls?"""
    series: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        if (row.tool == "torch.compile" or row.is_ours) and row.measured_peak and row.knob is not None:
            series[(row.model, row.tool)].append(row)
    lines = [
        "| model | tool | budgets, largest first → measured peak MiB | monotone? | every peak within its budget? |",
        "|---|---|---|---|---|",
    ]
    for (model, tool), points in series.items():
        points.sort(key=lambda row: -float(row.knob or 0))
        steps = []
        monotone = True
        for previous, current in itertools.pairwise(points):
            if current.measured_peak > previous.measured_peak * (1 + MONOTONE_TOLERANCE):  # type: ignore[operator]
                monotone = False
        for point in points:
            knob = f"{point.knob:g}" if tool == "torch.compile" else f"{(point.knob or 0) / MIB:.2f} MiB"
            steps.append(f"{knob} → {_mib(point.measured_peak)}")
        within = "n/a (a fraction of its own estimate)"
        if tool != "torch.compile":
            within = "yes" if all(p.measured_peak <= (p.knob or 0) for p in points) else "**no**"  # type: ignore[operator]
        lines.append(f"| {model} | {tool} | {'; '.join(steps)} | {'yes' if monotone else '**no**'} | {within} |")
    return "\n".join(lines)


def prediction_table(rows: Sequence[Row]) -> str:
    """Predicted against measured peak and step time for the tools that predict them (ours; a time only with
    profiled costs, and only in rows measured since it is recorded), and our own meter beside the one."""
    lines = [
        "| model | tool | configuration | budget MiB | predicted MiB | measured MiB (one meter) | measured / "
        "predicted | our dispatch meter MiB | predicted ms | measured ms | measured / predicted time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.predicted_peak is None and row.own_meter_peak is None:
            continue
        ratio = f"{row.measured_peak / row.predicted_peak:.3f}" if row.measured_peak and row.predicted_peak else ""
        predicted_ms = "—" if row.predicted_ms is None else f"{row.predicted_ms:.1f}"
        measured_ms = "—" if row.step_ms is None else f"{row.step_ms:.1f}"
        time_ratio = f"{row.step_ms / row.predicted_ms:.2f}" if row.step_ms and row.predicted_ms else "—"
        lines.append(
            f"| {row.model} | {row.tool} | {row.config} | {_mib(row.budget)} | {_mib(row.predicted_peak)} | "
            f"{_mib(row.measured_peak)} | {ratio} | {_mib(row.own_meter_peak)} | {predicted_ms} | {measured_ms} | "
            f"{time_ratio} |"
        )
    return "\n".join(lines)


def prediction_summary(rows: Sequence[Row]) -> str:
    """Per tool of ours, how far the measured step time is from the predicted one: the median and the extreme of
    measured / predicted over its rows, and how many rows are within 10 % and 20 %."""
    lines = [
        "| tool | rows with a predicted time | median measured / predicted | range | within 10 % | within 20 % |",
        "|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {}
    for row in rows:
        if row.step_ms and row.predicted_ms:
            ratios.setdefault(row.tool, []).append(row.step_ms / row.predicted_ms)
    for tool, values in sorted(ratios.items()):
        within_10 = sum(abs(value - 1) <= 0.10 for value in values)
        within_20 = sum(abs(value - 1) <= 0.20 for value in values)
        lines.append(
            f"| {tool} | {len(values)} | {statistics.median(values):.2f} | {min(values):.2f}–{max(values):.2f} | "
            f"{within_10} of {len(values)} | {within_20} of {len(values)} |"
        )
    return "\n".join(lines)


def render(rows: Sequence[Row], environment: dict[str, Any], *, plot: str | None = None) -> str:
    """The markdown report: every row, ours against each peer, monotonicity, predictions; and the plot if asked."""
    parts = [
        f"Command: `{environment.get('command', '')}`  ",
        f"torch {environment.get('torch')}, device {environment.get('device')}, {environment.get('threads')} "
        f"thread(s), meter: {environment.get('meter')}; started {environment.get('started')}, load average "
        f"{environment.get('load_average')}.",
        "",
        "### Every configuration",
        main_table(rows),
        "",
        "### Ours at each peer's measured peak",
        ratio_table(rows),
        "",
        ratio_summary(rows),
        "",
        "### Does the peak fall as the budget falls?",
        monotonicity_table(rows),
        "",
        "### Predicted against measured peak",
        prediction_table(rows),
    ]
    if plot:
        pareto_plot(rows, plot, caption=str(environment.get("command", "")))
        parts += ["", f"Plot written to `{plot}`."]
    return "\n".join(parts)


TOOL_STYLE = {
    "eager": ("black", "*"),
    "checkpoint": ("tab:blue", "o"),
    "SAC": ("tab:purple", "s"),
    "torch.compile": ("tab:orange", "^"),
    "ours (optimal)": ("tab:green", "D"),
    "ours (approx)": ("tab:olive", "v"),
    "ours+inductor (optimal)": ("tab:red", "P"),
    "ours+inductor (approx)": ("tab:pink", "X"),
    "ours+inductor-cl (optimal)": ("tab:cyan", "P"),
    "ours+inductor-cl (approx)": ("tab:cyan", "X"),
    "ours+inductor-contiguous (optimal)": ("tab:purple", "P"),
    "ours+inductor-contiguous (approx)": ("tab:purple", "X"),
    "ours+backend (optimal)": ("tab:brown", "*"),
    "ours+backend (approx)": ("tab:gray", "*"),
}


def pareto_plot(rows: Sequence[Row], path: str, *, caption: str = "") -> None:
    """Peak memory against step time, one curve per tool, one panel per model; `caption` (the command) below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(row.model for row in rows))
    columns = 2 if len(models) > 1 else 1
    lines = math.ceil(len(models) / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(6.5 * columns, 4.6 * lines), squeeze=False)
    for axis, model in zip(axes.flat, models, strict=False):
        tools: dict[str, list[Row]] = defaultdict(list)
        for row in rows:
            if row.model == model and row.measured_peak and row.step_ms:
                tools[row.tool].append(row)
        for tool, points in tools.items():
            color, marker = TOOL_STYLE.get(tool, ("gray", "x"))
            points.sort(key=lambda row: row.measured_peak or 0)
            xs = [(row.measured_peak or 0) / MIB for row in points]
            ys = [row.step_ms for row in points]
            axis.plot(xs, ys, marker=marker, color=color, label=tool, linestyle="-" if len(points) > 1 else "none")
            if tool == "torch.compile":
                for row, x, y in zip(points, xs, ys, strict=True):
                    axis.annotate(f"{row.knob:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        axis.set_title(model)
        axis.set_xlabel("peak memory, MiB (one meter)")
        axis.set_ylabel("step time, ms (median)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(models) :]:
        axis.set_visible(False)
    if caption:
        figure.text(0.01, 0.005, caption, fontsize=6, family="monospace", color="dimgray")
    figure.tight_layout(rect=(0, 0.02 if caption else 0, 1, 1))
    write_figure(figure, path, dpi=120)
    plt.close(figure)
