"""Where the suite's CPU goes, test by test: a pytest plugin for measuring, not for CI.

    PYTHONPATH=. .venv/bin/python -m pytest -p tests.harness.cpu_accounting   # as root
    .venv/bin/python -m tests.harness.cpu_accounting $RAYFLOW_CPU_LOG            # the tables

Each pytest-xdist worker moves itself into a cgroup (v1 `cpuacct`) of its own, so everything it
starts stays there: Ray's daemons, Spark's JVMs, a Kubernetes stack, the pods its kubelet runs,
even once orphaned. A test's figure is what its worker's group used between the test's start and
end (a module fixture's daemons count to the tests they live through). One JSON line per test in
$RAYFLOW_CPU_LOG (default: rayflow-cpu.jsonl in the system's temp folder). On 2 cores the suite
is CPU-bound (vmstat: no idle time), so its wall time follows the sum of these figures.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

CGROUPS = Path("/sys/fs/cgroup/cpuacct")
LOG = Path(os.environ.get("RAYFLOW_CPU_LOG", Path(tempfile.gettempdir(), "rayflow-cpu.jsonl")))
_group: Path | None = None


def _used() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config) -> None:
    global _group
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or not CGROUPS.is_dir():
        return
    _group = CGROUPS / f"rayflow-tests-{worker}-{os.getpid()}"
    _group.mkdir(exist_ok=True)
    (_group / "cgroup.procs").write_text(str(os.getpid()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _group is None:
        yield
        return
    cpu, wall = _used(), time.monotonic()
    yield
    line = {"id": item.nodeid, "cpu": _used() - cpu, "wall": time.monotonic() - wall}
    with LOG.open("a") as out:
        out.write(json.dumps(line) + "\n")


def report(path: Path, top: int = 30) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        module = modules[row["id"].split("::")[0]]
        module[0] += row["cpu"]
        module[1] += row["wall"]
    lines = [f"{len(rows)} tests: {sum(r['cpu'] for r in rows):.0f} CPU-s", "", "CPU-s  wall-s"]
    for name, (cpu, wall) in sorted(modules.items(), key=lambda m: -m[1][0])[:top]:
        lines.append(f"{cpu:5.0f}  {wall:6.0f}  {name}")
    lines += ["", "CPU-s  wall-s"]
    for row in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        lines.append(f"{row['cpu']:5.0f}  {row['wall']:6.0f}  {row['id']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else LOG))
