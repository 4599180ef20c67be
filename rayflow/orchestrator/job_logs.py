"""A submitted job's log, as this side shows and keeps it: streamed onto this terminal while the job
runs (LogStream: whole lines, masked, the job's own line to this side left out, the autoscaler's
lines summarised), read with a size cap from the head once it ended (bounded_log), and its last
lines shown after a failure (print_last_lines). Everything shown is masked, then made printable
(rayflow.security.printable): a log is data, never commands to the terminal."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

from rayflow.runtime import ray_internals
from rayflow.runtime.verbosity import autoscaler_lines
from rayflow.security.printable import printable
from rayflow.security.redaction import mask_text

LAST_LINES = 25  # of a failed job's log, printed after it

JOB_LOG = "job/driver.log"  # in the parent MLflow run: a submitted job's driver log (its end)

# A job's log is kept, shown and stored up to its last LOG_CAP_BYTES: a job that prints without
# end does not fill this machine's memory or MLflow. Ray's Jobs API has no range: its answer is
# read as it comes, keeping the end, for at most LOG_READ_MAX_BYTES and LOG_READ_TIMEOUT_S.
LOG_CAP_BYTES = 8 * 2**20
LOG_READ_MAX_BYTES = 256 * 2**20
LOG_READ_TIMEOUT_S = 120.0


def print_last_lines(log: str, job_id: str, where: str | None = None) -> None:
    """The last lines of a failed job's log on stderr (with where its log is kept, when it is),
    masked and printable."""
    lines = log.rstrip("\n").split("\n")[-LAST_LINES:]  # "\n" only, as the channel reads it
    whole = f"; its log: {where}" if where else ""
    print(f"[rayflow] the last {len(lines)} lines of job {job_id}{whole}:", file=sys.stderr)
    for line in lines:
        print(f"  | {printable(mask_text(line))}", file=sys.stderr)
    sys.stderr.flush()


class LogStream(threading.Thread):
    """Follows a job's logs (the Jobs API's websocket) onto this terminal, whole lines at a time,
    leaving out the lines that start with `hidden` (what the job says to this side, not to the
    user), and with the autoscaler's lines summarised unless `verbose` asks for them
    (verbosity.autoscaler_lines). A line longer than LOG_CAP_BYTES is shown in pieces of it."""

    def __init__(
        self, client: Any, job_id: str, hidden: str | None = None, verbose: int | bool = 0
    ) -> None:
        super().__init__(name="rayflow-job-logs", daemon=True)
        self.client, self.job_id, self.hidden, self.verbose = client, job_id, hidden, verbose
        self.lines: list[str] = []

    def _write(self, text: str) -> None:
        # "\n" only: a task's line with \u2028 or \x85 in it is one line, shown escaped
        *complete, tail = text.split("\n")
        complete = autoscaler_lines(complete, self.verbose)
        shown = [
            mask_text(line)
            for line in complete
            if not (self.hidden and line.startswith(self.hidden))
        ]
        out = "".join(printable(line) + "\n" for line in shown)
        # the end, without its newline
        if tail and not (self.hidden and tail.startswith(self.hidden)):
            shown.append(mask_text(tail))
            out += printable(shown[-1])
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
                if len(partial) > LOG_CAP_BYTES:  # a line without end: shown as it comes
                    self._write(partial + "\n")
                    partial = ""
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


def bounded_log(client: Any, job_id: str, streamed: list[str]) -> str:
    """The job's driver log as the head keeps it, its last LOG_CAP_BYTES at most (a first line
    says what was left out); what was streamed when the head cannot say."""
    from requests.exceptions import RequestException

    last: Exception | None = None
    for _ in range(3):
        try:
            return _capped(client, job_id)
        # RuntimeError: the Jobs API answered an error
        except (RequestException, RuntimeError) as err:
            last = err
            time.sleep(1.0)
    print(
        f"rayflow: warning: could not fetch job {job_id}'s log ({first_line(last)}); "
        "keeping the streamed lines",
        file=sys.stderr,
        flush=True,
    )
    return "\n".join(streamed) + "\n"


def _capped(client: Any, job_id: str) -> str:
    """Ray's own client reads the Jobs API's answer whole: it is read here as it comes, keeping
    the end. A client of another kind (a stand-in) is asked as it is, its answer cut the same."""
    from ray.dashboard.modules.job.sdk import JobSubmissionClient

    if not isinstance(client, JobSubmissionClient):
        text = str(client.get_job_logs(job_id))
        data = text.encode()
        if len(data) <= LOG_CAP_BYTES:
            return text
        kept = data[-LOG_CAP_BYTES:].decode(errors="replace").partition("\n")[2]
        return _left_out_note(job_id, len(data) - len(kept.encode()), complete=True) + kept
    return _read_jobs_api(client, job_id)


def _read_jobs_api(client: Any, job_id: str) -> str:
    import requests

    deadline = time.monotonic() + LOG_READ_TIMEOUT_S
    kept, total, complete = bytearray(), 0, True
    with requests.get(
        f"{client.get_address()}/api/jobs/{job_id}/logs",
        **ray_internals.jobs_client_request_options(client),
        stream=True,
        timeout=30,
    ) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"the Jobs API answered HTTP {answer.status_code}")
        for chunk in answer.iter_content(1 << 16):
            total += len(chunk)
            kept += chunk
            del kept[: max(0, len(kept) - LOG_CAP_BYTES)]
            if total >= LOG_READ_MAX_BYTES or time.monotonic() > deadline:
                complete = False
                break
    if complete and total <= LOG_CAP_BYTES:
        try:
            return str(json.loads(kept)["logs"])
        except (ValueError, KeyError, TypeError):
            raise RuntimeError("the Jobs API's answer is not a job's log") from None
    text = _json_string_tail(kept.decode(errors="replace"), complete)
    return _left_out_note(job_id, total - len(kept), complete) + text


def _json_string_tail(raw: str, complete: bool) -> str:
    """The text of the end of a JSON string (`...\\nlast lines"}`), from its first whole line: after
    its first escaped newline, to the closing quote, or, where reading stopped early, to its last
    escaped newline. Empty where no newline is left in it."""
    newlines = _escaped_newlines(raw, at_boundary=False)
    if not newlines:
        return ""
    body = raw[newlines[0] :]
    if not complete:
        ends = _escaped_newlines(body, at_boundary=True)
        body = (body[: ends[-1]] if ends else "") + '"'
    try:
        # the string value, up to its closing quote (what follows, `}`, is left alone)
        return str(json.JSONDecoder().raw_decode('"' + body)[0])
    except ValueError:
        raise RuntimeError("the Jobs API's answer is not a job's log") from None


def _escaped_newlines(raw: str, at_boundary: bool) -> list[int]:
    """The index just past each `\\n` escape in a JSON string's text. A run of backslashes after
    another character starts escapes, so its length says whether its last one escapes the `n`;
    a run at the very start counts only where the text starts at an escape's start
    (`at_boundary`), not where it was cut anywhere."""
    found, at = [], raw.find("\\n")
    while at != -1:
        run = at
        while run > 0 and raw[run - 1] == "\\":
            run -= 1
        if (run > 0 or at_boundary) and (at - run) % 2 == 0:
            found.append(at + 2)
        at = raw.find("\\n", at + 2)
    return found


def _left_out_note(job_id: str, left_out: int, complete: bool) -> str:
    end = "" if complete else ", and it goes on past what rayflow reads"
    return (
        f"[rayflow] the first {left_out / 2**20:.1f} MiB of job {job_id}'s log are left out: "
        f"rayflow keeps the last {LOG_CAP_BYTES / 2**20:g} MiB{end}\n"
    )


def first_line(err: BaseException | None) -> str:
    """An error's first line, masked (the whole of it may quote a URL with its password) and
    printable (it may quote what a cluster answered)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return printable(mask_text(lines[0] if lines else type(err).__name__))
