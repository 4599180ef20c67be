"""`python -m rayflow.launcher.on_head BUNDLE`: a submitted sweep's driver, as a Ray Job on the
head. It takes the result key out of its environment before the bundle (the app's code) is loaded,
joins the cluster the job runs on, runs the bundle's jobs (rayflow.launcher.jobs.run_batch), and
ends with one signed line for the launching side (rayflow.launcher.submit.result_line)."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from rayflow.security.result_channel import emit, take_key

    take_key()  # before any of the app's code is unpickled
    import cloudpickle
    import ray

    from rayflow.launcher.jobs import run_batch
    from rayflow.launcher.submit import result_line
    from rayflow.security.printable import printable
    from rayflow.security.redaction import mask_text

    bundle = cloudpickle.loads(Path(argv[0]).read_bytes())  # what the launching process sent
    ray.init()  # the job's own cluster (RAY_ADDRESS)
    finished = run_batch(
        bundle.shared,
        bundle.jobs,
        bundle.max_concurrent,
        bundle.on_failure,
        bundle.schedule_timeout_s,
        say=lambda line: print(printable(mask_text(line)), flush=True),
    )
    emit(result_line(finished))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
