"""`rayflow status`, `rayflow down NAME|--all` and `rayflow logs NAME [JOB] [--follow]`: the kept
clusters, seen and stopped from the command line (rayflow.orchestrator.clusters does the work; the
same calls are `rayflow.clusters()`, `rayflow.down()` and `rayflow.logs()`); `rayflow key`, this
user's public key (rayflow.security.keys), which signs their experiments: what a teammate lists in
`trusted_signers`; and `rayflow sign PATH`, an experiment signed as this user's on their word
(a run of theirs killed before it signed what it wrote last).

Exit codes as a run's: 0 done, 1 a cluster failed to answer or to go, 2 bad input (an unknown
name, a cluster in use without --force), one line naming what was wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

COMMANDS = ("status", "down", "logs", "key", "sign")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rayflow", description="the clusters rayflow kept")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="a table of the kept clusters, asked as they are now")
    status.add_argument("--json", action="store_true", help="one JSON list, for scripts")
    down = sub.add_parser("down", help="tear down a kept cluster (what its run started)")
    which = down.add_mutually_exclusive_group(required=True)
    which.add_argument("name", nargs="?", help="NAME or BACKEND/NAME, as `status` shows it")
    which.add_argument("--all", action="store_true", help="every kept cluster")
    down.add_argument("--force", action="store_true", help="even while a job is using it")
    logs = sub.add_parser("logs", help="a kept cluster's job log (its last job's by default)")
    logs.add_argument("name", help="NAME or BACKEND/NAME")
    logs.add_argument("job", nargs="?", help="the job's submission id")
    logs.add_argument("--follow", action="store_true", help="stream it until the job ends")
    sub.add_parser(
        "key",
        help="this user's public key, which signs their experiments: what a teammate lists in "
        "trusted_signers to resume them",
    )
    sign = sub.add_parser(
        "sign",
        help="sign an experiment as yours as it is now, having looked at it: one a run of yours "
        "wrote but was killed before it signed (resume refuses it as changed)",
    )
    sign.add_argument("path", help="the experiment's folder or s3://, gs:// URI")
    return parser


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _autostop(row) -> str:
    if not row.autostop_idle_minutes:
        return "off"
    when = f"in {_duration(row.autostop_in_s)}" if row.autostop_in_s is not None else row.state
    return f"{row.autostop_idle_minutes:g} min ({when})"


def table(rows) -> str:
    """`rayflow status` as a user reads it. Names, states and details come from records and
    clusters: shown printable (rayflow.security.printable), each cell on its one line."""
    from rayflow.security.printable import printable_line

    if not rows:
        return "no kept clusters"
    head = ("BACKEND", "NAME", "STATE", "NODES", "UP", "IDLE", "AUTOSTOP", "NODE-SECONDS", "JOBS")
    lines: list[tuple[str, ...]] = [head]
    for r in rows:
        nodes = f"{r.nodes}/{r.peak_nodes}" if r.nodes is not None else "-"
        used = f"{r.node_seconds:.0f}" if r.node_seconds is not None else "-"
        jobs = str(r.jobs) if r.jobs is not None else "-"
        up, idle = _duration(r.up_s), _duration(r.idle_s)
        cells = (r.backend, r.name, r.state, nodes, up, idle, _autostop(r), used, jobs)
        lines.append(tuple(printable_line(str(cell)) for cell in cells))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    notes = [f"  {printable_line(r.name)}: {printable_line(r.detail)}" for r in rows if r.detail]
    return "\n".join(out + notes)


def _fail(err: Exception, code: int) -> None:
    from rayflow.security.printable import printable
    from rayflow.security.redaction import masked_message

    # an error may quote what a cluster answered: masked, then printable
    print(f"rayflow: error: {printable(masked_message(err))}", file=sys.stderr)
    sys.exit(code)


def main(argv: list[str]) -> None:
    from rayflow.errors import ClusterError, ConfigError, JobError
    from rayflow.orchestrator import clusters
    from rayflow.security.printable import printable, printable_line

    args = _parser().parse_args(argv)
    if args.command == "key":  # on stdout alone, for scripts
        from rayflow.security.keys import public_id

        try:
            print(public_id())
        except ClusterError as err:
            _fail(err, 1)
        return
    if args.command == "sign":
        _sign(args.path)
        return
    # What Ray's launcher prints while a cluster is reached (its SSH settings bootstrapped) goes
    # to stderr: stdout is the answer alone (`status --json` feeds scripts).
    quiet = contextlib.redirect_stdout(sys.stderr)
    try:
        if args.command == "status":
            with quiet:
                rows = clusters.clusters()
            print(json.dumps([r.as_dict() for r in rows]) if args.json else table(rows))
        elif args.command == "down":
            with quiet:
                done, failed = clusters.down_each(None if args.all else args.name, args.force)
            for name in done:
                print(f"[rayflow] {printable_line(name)}: torn down")
            for line in failed:  # not reached: the record kept, how to finish by hand
                print(f"rayflow: error: {printable_line(line)}", file=sys.stderr)
            if failed:
                sys.exit(1)
        else:
            with contextlib.nullcontext() if args.follow else quiet:
                text = clusters.logs(args.name, args.job, args.follow)
            sys.stdout.write(printable(text))  # a log is data: masked already, made printable
    except ConfigError as err:
        _fail(err, 2)
    except (ClusterError, JobError) as err:
        _fail(err, 1)


def _sign(path: str) -> None:
    """`rayflow sign PATH`: refused (exit 2) for what is not an experiment, or one a run holds."""
    from pathlib import Path

    from rayflow.errors import ClusterError, ConfigError
    from rayflow.results import storage
    from rayflow.results.experiment import STATE_FILE, Experiment, is_running
    from rayflow.results.verification import adopt

    where = path.rstrip("/") if storage.is_uri(path) else str(Path(path).expanduser().resolve())
    try:
        experiment = Experiment(where)
        if not experiment.has(STATE_FILE):
            raise ConfigError("path", f"{where} is not a rayflow experiment (no {STATE_FILE})")
        if is_running(experiment):
            raise ConfigError("path", f"{where} is held by a run now: it signs it itself")
        before = adopt(where)
    except ConfigError as err:
        _fail(err, 2)
    except (ClusterError, OSError, storage.StorageError) as err:
        _fail(err, 1)
    print(f"[rayflow] signed {where} as yours ({before})")
