"""What every benchmark of scripts/bench.py shares: its log line, the `--smoke` option, bounded waits.

`--smoke` (each subcommand's `*_args` calls `smoke_option` with its own sizes) runs the same code
paths of both sides with the least work that proves they still run: the sizes it names become the
defaults, options given beside it win (bench.py's main parses the command line again with them).
It is what tests/test_bench.py runs, so that no subcommand rots; its figures measure nothing.
"""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def smoke_option(parser, **sizes) -> None:
    """Add `--smoke`: `sizes` (dest -> value) become the defaults of the subcommand's options."""
    shown = " ".join(f"--{dest.replace('_', '-')} {value}" for dest, value in sizes.items())
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"the tests' smoke run, not a measurement: the whole path of both sides at the least "
        f"size ({shown}); options given beside it win",
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
