"""Argument parsing shared by the subcommands."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from checkmate.byte_sizes import parse_bytes
from checkmate.errors import InvalidArgument
from checkmate.graph import Graph
from checkmate.moved import LinkSpeeds


def key_values(items: Sequence[str], flag: str) -> dict[str, Any]:
    """`KEY=VALUE` items (from repeated `flag`s) as keyword arguments, each VALUE read as JSON when it parses, else
    as text."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, separator, text = item.partition("=")
        if not separator or not key:
            raise InvalidArgument(f"{flag} {item!r} must look like KEY=VALUE")
        try:
            parsed[key] = json.loads(text)
        except json.JSONDecodeError:
            parsed[key] = text
    return parsed


def host_link_options(parser: argparse.ArgumentParser) -> None:
    """The link to host memory, for plans that may move values there and back (`checkmate.moved`)."""
    group = parser.add_argument_group(
        "moves to host memory", "given --to-host and --to-device, the plan may copy values to host memory and back"
    )
    group.add_argument("--to-host", type=float, metavar="BYTES_PER_S", help="bandwidth from the device to host memory")
    group.add_argument("--to-device", type=float, metavar="BYTES_PER_S", help="bandwidth from host memory back")
    group.add_argument("--link-latency", type=float, default=0.0, metavar="SECONDS", help="each copy's latency")
    group.add_argument(
        "--link-overlap", type=float, default=1.0, help="the fraction of a stage's compute copies run beside (0 to 1)"
    )
    group.add_argument("--host-budget", help="the most host memory moved values may take (bytes or a size: 64GiB)")
    group.add_argument(
        "--cost-per-second",
        type=float,
        default=1.0,
        help="what a second costs in the graph's unit: 1 for profiled graphs (seconds), the device's FLOP/s for "
        "graphs costed in FLOPs",
    )


def with_host_link(arguments: argparse.Namespace, graph: Graph) -> Graph:
    """`graph` with the link the options give (unchanged without --to-host and --to-device)."""
    given = (arguments.to_host is not None, arguments.to_device is not None)
    if not any(given):
        if arguments.host_budget is not None:
            raise InvalidArgument("--host-budget needs the link: give --to-host and --to-device too")
        return graph
    if not all(given):
        raise InvalidArgument("give both --to-host and --to-device (bytes per second each way)")
    try:
        speeds = LinkSpeeds(arguments.to_host, arguments.to_device, arguments.link_latency, arguments.link_overlap)
        host_budget = None if arguments.host_budget is None else parse_bytes(arguments.host_budget)
        link = speeds.priced(arguments.cost_per_second, host_budget)
    except ValueError as error:
        raise InvalidArgument(f"the host link options: {error}") from None
    return dataclasses.replace(graph, host_link=link)
