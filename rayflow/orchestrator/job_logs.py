"""A submitted job's log, as this side shows and keeps it: streamed onto this terminal while the job
runs (LogStream: whole lines, masked, the job's own line to this side left out, the autoscaler's
lines summarised), fetched whole from the head once it ended (whole_log), and its last lines shown
after a failure (print_last_lines)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

from rayflow.runtime.progress import autoscaler_lines
from rayflow.security.redaction import mask_text

LAST_LINES = 25  # of a failed job's log, printed after it

JOB_LOG = "job/driver.log"  # in the parent MLflow run: a submitted job's whole driver log


def print_last_lines(log: str, job_id: str, where: str | None = None) -> None:
    """The last lines of a failed job's log on stderr (with where the whole log is, when kept),
    masked."""
    lines = log.rstrip("\n").split("\n")[-LAST_LINES:]  # "\n" only, as the channel reads it
    whole = f"; the whole log: {where}" if where else ""
    print(f"[rayflow] the last {len(lines)} lines of job {job_id}{whole}:", file=sys.stderr)
    for line in lines:
        print(f"  | {mask_text(line)}", file=sys.stderr)
    sys.stderr.flush()


class LogStream(threading.Thread):
    """Follows a job's logs (the Jobs API's websocket) onto this terminal, whole lines at a time,
    leaving out the lines that start with `hidden` (what the job says to this side, not to the
    user), and with the autoscaler's lines summarised unless `verbose` asks for them
    (progress.autoscaler_lines)."""

    def __init__(
        self, client: Any, job_id: str, hidden: str | None = None, verbose: int | bool = 0
    ) -> None:
        super().__init__(name="rayflow-job-logs", daemon=True)
        self.client, self.job_id, self.hidden, self.verbose = client, job_id, hidden, verbose
        self.lines: list[str] = []

    def _write(self, text: str) -> None:
        # "\n" only: a task's line with \u2028 or \x85 in it is one line, shown as it is (masked)
        *complete, tail = text.split("\n")
        complete = autoscaler_lines(complete, self.verbose)
        shown = [
            mask_text(line)
            for line in complete
            if not (self.hidden and line.startswith(self.hidden))
        ]
        out = "".join(line + "\n" for line in shown)
        # the end, without its newline
        if tail and not (self.hidden and tail.startswith(self.hidden)):
            shown.append(mask_text(tail))
            out += shown[-1]
        sys.stdout.write(out)
        sys.stdout.flush()
        self.lines = (self.lines + shown)[-200:]

    def run(self) -> None:
        async def follow() -> None:
            partial = ""  # a chunk may end mid-line: a hidden line is recognised whole
            async for chunk in self.client.tail_job_logs(self.job_id):
                partial += chunk
                done, _, partial = partial.rpartition("\n")
                if done:
                    self._write(done + "\n")
            if partial:
                self._write(partial)

        try:
            asyncio.run(follow())
        # Broad on purpose: the stream is a convenience (a websocket the head may drop, a bug in
        # it included); the job's status, polled apart, decides the outcome.
        except Exception as err:  # noqa: BLE001
            print(
                f"[rayflow] job log stream ended: {type(err).__name__}", file=sys.stderr, flush=True
            )


def whole_log(client: Any, job_id: str, streamed: list[str]) -> str:
    """The job's driver log as the head keeps it; what was streamed when the head cannot say."""
    from requests.exceptions import ConnectionError as Disconnected

    last: Exception | None = None
    for _ in range(3):
        try:
            return str(client.get_job_logs(job_id))
        except (Disconnected, RuntimeError) as err:  # RuntimeError: the Jobs API answered an error
            last = err
            time.sleep(1.0)
    print(
        f"rayflow: warning: could not fetch job {job_id}'s log ({first_line(last)}); "
        "keeping the streamed lines",
        file=sys.stderr,
        flush=True,
    )
    return "\n".join(streamed) + "\n"


def first_line(err: BaseException | None) -> str:
    """An error's first line, masked (the whole of it may quote a URL with its password)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return mask_text(lines[0] if lines else type(err).__name__)
