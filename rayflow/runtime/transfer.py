"""A download's progress line: bytes, rate and time left, redrawn on a terminal.

`Transfer` is a phase (rayflow.runtime.progress) that counts bytes: on a terminal it redraws
`[rayflow] data: downloading x.tar.gz: 76.5 MB / 170.5 MB (45%), 6.2 MB/s, 15 s left`, as
torchvision's download does; on any stderr its end line gives the size and the mean rate. Kept
apart from the phases themselves with the formatting of sizes, rates and spans it alone uses.
"""

from __future__ import annotations

import collections
import time
from typing import TextIO

from rayflow.runtime.progress import Phase

REDRAW_EVERY_S = 0.2  # a download redraws at most this often
RATE_WINDOW_S = 5.0  # the rate (and time left) of a download is over its last seconds


def format_size(n: float) -> str:
    """Bytes in decimal units, as downloads are usually quoted: 170498071 -> '170.5 MB'."""
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000.0
        if n < 999.95 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def format_rate(bytes_per_s: float) -> str:
    return format_size(bytes_per_s) + "/s"


def format_duration(seconds: float) -> str:
    """A short span for 'time left': '8 s', '2 min 05 s', '1 h 02 min'."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def time_left(done: int, total: int | None, rate: float) -> float | None:
    """Seconds until `total` at `rate`; None when that cannot be known."""
    if not total or rate <= 0 or done > total:
        return None
    return (total - done) / rate


class Transfer(Phase):
    """A download:
    `with Transfer("downloading x.tar.gz", "data") as t: t.expect(total); t.update(n)...`.

    On a terminal: `[rayflow] data: downloading x.tar.gz: 76.5 MB / 170.5 MB (45%), 6.2 MB/s,
    15 s left`, redrawn; the end line (any stderr) gives the size and mean rate.
    """

    def __init__(self, what: str, backend: str, stream: TextIO | None = None, **kwargs):
        kwargs.setdefault("tick_after_s", 0.0)  # a stalled download shows its rate falling at once
        super().__init__(what, backend, stream, **kwargs)
        self.total: int | None = None
        self.bytes = 0
        self.transfer_s: float | None = None  # set when the bytes are all there
        self._window: collections.deque = collections.deque()
        self._drawn = 0.0

    def expect(self, total: int | None) -> None:
        self.total = total if total and total > 0 else None

    def update(self, n: int) -> None:
        self.bytes += n
        now = time.monotonic()
        self._window.append((now, self.bytes))
        while len(self._window) > 2 and now - self._window[0][0] > RATE_WINDOW_S:
            self._window.popleft()
        if self.tty and now - self._drawn >= REDRAW_EVERY_S:
            self._drawn = now
            self.redraw()

    def finished(self) -> None:
        """The bytes are all there (what follows, e.g. unpacking, is not transfer time)."""
        self.transfer_s = self.elapsed

    def rate(self) -> float:
        """Bytes per second over the last RATE_WINDOW_S (falling while nothing arrives)."""
        if self.transfer_s is not None:
            return self.mean_rate()
        if not self._window:
            return 0.0
        first_t, first_b = self._window[0]
        if len(self._window) == 1:
            first_t, first_b = self.started, 0
        span = time.monotonic() - first_t
        return (self.bytes - first_b) / span if span > 0 else 0.0

    def mean_rate(self) -> float:
        span = self.transfer_s if self.transfer_s is not None else self.elapsed
        return self.bytes / span if span > 0 else 0.0

    def summary(self) -> str:
        """'170.5 MB at 6.2 MB/s' (the mean rate of the transfer)."""
        return f"{format_size(self.bytes)} at {format_rate(self.mean_rate())}"

    def live(self) -> tuple[str, str]:
        if self.transfer_s is not None:  # unpacking, checking: a plain phase line from here
            return (
                f"{self.prefix}{self.what}: {self.summary()}",
                f"{self._detail()}... {self.elapsed:.0f} s",
            )
        rate = self.rate()
        if self.total:
            left = time_left(self.bytes, self.total, rate)
            numbers = (
                f" {format_size(self.bytes)} / {format_size(self.total)} "
                f"({100 * self.bytes // self.total}%), {format_rate(rate)}, "
                f"{format_duration(left) + ' left' if left is not None else 'time left unknown'}"
            )
        else:
            numbers = f" {format_size(self.bytes)}, {format_rate(rate)}, {self.elapsed:.0f} s"
        return f"{self.prefix}{self.what}:", numbers

    def end_line(self, error: BaseException | None) -> str:
        if error is None and self.result is None:
            return f"{self.prefix}{self.what}: {self.summary()}, done in {self.elapsed:.1f} s"
        if error is not None and self.bytes:
            return super().end_line(error) + f" ({format_size(self.bytes)} received)"
        return super().end_line(error)


__all__ = ["Transfer", "format_duration", "format_rate", "format_size", "time_left"]
