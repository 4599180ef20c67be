"""The one channel a submitted job (a run on vm or kuberay, or a launcher's sweep on the head)
sends its result back on: one line of its driver log, `MARKER MAC JSON`.

What the log of a job holds is not all the job's own: the tasks it runs print into it, and what
they print can come from anywhere (a dataset, a library, another user's code on the cluster). So
the line is read as data, never as code (JSON, never pickle), and only believed when it carries
an HMAC-SHA256 of its marker and JSON under a key that the submitting process made for this one
submission (`new_key`) and handed to the job's driver by environment (KEY_ENV). The driver takes
the key out of its environment before any user code runs (`take_key`), also out of the job's
config that Ray hands to its workers, so the tasks never see it. Lines are split on "\\n" only:
`str.splitlines()` also splits on \\x1c, \\x85, \\u2028 and others, which a task can print in the
middle of its own line to start one with the marker. The side that submitted reads the line only
from a job that SUCCEEDED (`read`, called by rayflow.results.run_result and
rayflow.launcher.submit).

Residual risk: code running on the head as the same OS user as the job's driver can read the
driver's memory or /proc/PID/environ at start-up, and anyone holding the cluster's token can read
the job's runtime_env through the Jobs API (and run any code there anyway).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sys
from typing import Any

KEY_ENV = "RAYFLOW_RESULT_KEY"  # in the job's runtime_env env_vars; removed by the driver at once


class _TakenKey:
    """The key this process, a job's driver, took from its environment (`take_key`); None in any
    other process. Process-wide: it comes in the process's environment, and every result line the
    driver prints is signed with it, whichever part of rayflow prints one (`signed_line`); its
    one instance is `_TAKEN`."""

    def __init__(self) -> None:
        self.key: bytes | None = None


_TAKEN = _TakenKey()


def new_key() -> str:
    """A fresh key for one submission (hex, 256 bits), held by the submitting process only."""
    return secrets.token_bytes(32).hex()


def take_key() -> bytes | None:
    """On the job's driver, before any user code runs: the key out of os.environ and out of the
    job config Ray gives this driver's workers (RAY_JOB_CONFIG_JSON_ENV_VAR's runtime_env), kept
    in this process only. None when the job was not handed one."""
    value = os.environ.pop(KEY_ENV, None)
    scrub_job_config(KEY_ENV)
    if value:
        _TAKEN.key = bytes.fromhex(value)
    return _TAKEN.key


def scrub_job_config(name: str) -> None:
    """The environment variable `name` out of the job config Ray hands this driver's workers
    (a key handed to the driver is the driver's alone)."""
    # Ray's private name, through its door: the one import of this package from a layer above
    # (pyproject.toml's ignore_imports), made when called, as Ray's own import was
    from rayflow.runtime.ray_internals import job_config_env_var

    variable = job_config_env_var()
    text = os.environ.get(variable)
    if not text:
        return
    config = json.loads(text)
    env_vars = (config.get("runtime_env") or {}).get("env_vars") or {}
    if name in env_vars:
        del env_vars[name]
        os.environ[variable] = json.dumps(config)


def _mac(key: bytes, marker: str, payload: str) -> str:
    return hmac.new(key, (marker + payload).encode("utf-8"), hashlib.sha256).hexdigest()


def signed_line(marker: str, data: Any, key: bytes | None = None) -> str | None:
    """`marker` + MAC + strict JSON of `data` on one line; None when this process holds no key
    (a job that was not submitted by rayflow: nothing would believe the line)."""
    key = key if key is not None else _TAKEN.key
    if key is None:
        return None
    # ASCII: no character splits the line; what JSON cannot hold (bytes in a config, an object)
    # goes as its repr string
    payload = json.dumps(data, ensure_ascii=True, default=repr)
    return f"{marker}{_mac(key, marker, payload)} {payload}"


def emit(line: str) -> None:
    """Print `line` on a line of its own, in one write to the log: Ray's log thread in the same
    driver prints its workers' lines meanwhile (`(task pid=...) ...`), and print() writes the text
    and its newline apart, so a line of theirs could land in the middle or at the end of it."""
    data = ("\n" + line + "\n").encode("utf-8")
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a notebook's stream): one write()
        sys.stdout.write(data.decode("utf-8"))
        sys.stdout.flush()
        return
    while data:
        data = data[os.write(fd, data) :]


def lines(log: str) -> list[str]:
    """The log's lines as a terminal shows them: split on "\\n" only (a trailing "\\r" dropped)."""
    return [line[:-1] if line.endswith("\r") else line for line in log.split("\n")]


def read(log: str, marker: str, key: bytes) -> Any | None:
    """The data of the last line of `log` that starts with `marker` and carries a MAC that `key`
    verifies; None when there is none. A marked line that does not verify is ignored, with one
    warning line on stderr (something on the cluster printed it, or the log was cut)."""
    found, forged = None, 0
    for line in lines(log):
        if not line.startswith(marker):
            continue
        mac, _, payload = line[len(marker) :].partition(" ")
        # what another writer may have put after it is not part of it
        payload = _json_prefix(payload)
        if hmac.compare_digest(
            mac.encode("ascii", "replace"), _mac(key, marker, payload).encode("ascii")
        ):
            found = payload
        else:
            forged += 1
    if forged:
        print(
            f"rayflow: warning: ignored {forged} line(s) of the job's log that start with "
            f"{marker.strip()!r} but were not signed by this submission",
            file=sys.stderr,
            flush=True,
        )
    return json.loads(found) if found is not None else None


def _json_prefix(payload: str) -> str:
    """The JSON document `payload` starts with (the whole text when it is not JSON)."""
    try:
        return payload[: json.JSONDecoder().raw_decode(payload)[1]]
    except ValueError:
        return payload


def without(log: str, marker: str) -> str:
    """`log` without the lines that start with `marker` (what the user is shown)."""
    return "\n".join(line for line in log.split("\n") if not line.startswith(marker))
