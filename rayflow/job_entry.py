"""`python -m rayflow.job_entry`: a submitted run's driver on the head
(rayflow.orchestrator.submission).

The command line is the same for every run (`ps`, JobInfo.entrypoint and the dashboard show it):
the run's overrides come from the request shipped with the job
(rayflow.orchestrator.submission.read_request). Before anything of the user's is imported, the
driver takes the result key and the experiment's signing key out of its environment
(rayflow.security.result_channel.take_key, rayflow.results.trust.take_delegate), then
runs rayflow's CLI on the overrides as `python -m rayflow OVERRIDES` would (sys.argv is this
process's own copy; the OS's command line stays the fixed one).
"""

from __future__ import annotations

import sys


def main() -> None:
    from rayflow.orchestrator.submission import on_head, read_request
    from rayflow.results.trust import take_delegate
    from rayflow.security.result_channel import take_key

    take_key()
    take_delegate()
    request = read_request()
    sys.argv = [sys.argv[0], *request["overrides"]]
    from rayflow.cli import main as cli_main

    cli_main(on_head())  # what the submitting side said, read here once, goes with each Plan


if __name__ == "__main__":
    main()
