"""What every benchmark of scripts/bench.py shares: its log line, the `--smoke` option, bounded waits.

`--smoke` (each subcommand's `*_args` calls `smoke_option` with its own sizes) runs the same code
paths of both sides with the least work that proves they still run: the sizes it names become the
defaults, options given beside it win (bench.py's main parses the command line again with them).
A phase that only measures (waiting for an autoscaler to add or remove a node, a settle sleep) is
left out (`args.smoke`): each cluster is still started, used and stopped as the measurement does
it, and the figures of a left-out phase are null in the JSON line, which then holds
`"smoke": true`. It is what tests/test_bench.py runs, so that no subcommand rots; its figures
measure nothing.
"""

from __future__ import annotations

import statistics
import sys
import time


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def smoke_option(parser, skips: str = "", **sizes) -> None:
    """Add `--smoke`: `sizes` (dest -> value) become the defaults of the subcommand's options;
    `skips` says which phases that only measure the smoke run leaves out."""
    shown = " ".join(f"--{dest.replace('_', '-')} {value}" for dest, value in sizes.items())
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"the tests' smoke run, not a measurement: the whole path of both sides at the least "
        f"size ({shown}){'; ' + skips if skips else ''}; options given beside it win",
    )
    parser.set_defaults(smoke_sizes=sizes)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2) -> float:
    """Seconds until `predicate()` is true; RuntimeError naming `what` after `timeout` seconds."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"bench: no {what} within {timeout:g} s")
        time.sleep(interval)
    return time.monotonic() - start


# A figure a smoke run leaves unmeasured is None (null in the JSON line): these carry it through.
def median_or_none(values) -> float | None:
    """The median of `values`; None where one of them is None."""
    values = list(values)
    return None if None in values else statistics.median(values)


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def seconds(value: float | None) -> str:
    """`value` for a log line: "12.3 s", or "not measured"."""
    return "not measured" if value is None else f"{value:.1f} s"
