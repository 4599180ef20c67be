"""hydra-launcher: the same sweep of a Hydra app (examples/hydra-app, each job holding
--job-seconds) through hydra/launcher=rayflow on backend=local (2 CPUs: two jobs at once) and
through Hydra's basic launcher (one job after another in the app's process), each the whole
command a user runs, alternating, the median of --repeats. `ratio` = rayflow's wall / ideal,
where ideal is jobs x job-seconds / slots; `speedup` = basic's wall / rayflow's wall. rayflow's
wall includes starting and stopping its Ray cluster.

With --ray-launcher-venv (a venv of hydra-core and hydra-ray-launcher 1.2.2, Hydra's own Ray
launcher, released for Ray 2.x, made with pip on first use), the same sweep through
`hydra/launcher=ray` (its local mode: ray.init with 2 CPUs) as a third side, alternating:
`ray_launcher_wall_s`, and `vs_ray_launcher` = rayflow's wall / its.

--smoke: 2 jobs of 0.5 s through rayflow's launcher and the basic one, once."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import smoke_option

REPO = Path(__file__).resolve().parents[1]
SLOTS = 2


def _sweep(
    app: Path, launcher: list[str], jobs: int, seconds: float, python: str = sys.executable
) -> float:
    env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "token"))
    argv = [
        python,
        "my_app.py",
        "-m",
        *launcher,
        f"hold_s={seconds}",
        "seed=" + ",".join(map(str, range(jobs))),
        f"hydra.sweep.dir={tempfile.mkdtemp(prefix='sweep-', dir=app)}",
    ]
    started = time.monotonic()
    out = subprocess.run(argv, cwd=app, env=env, stdout=sys.stderr, stderr=sys.stderr, timeout=900)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"the sweep failed: {' '.join(argv)}")
    return wall


def hydra_launcher(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as tmp:
        app = Path(shutil.copytree(REPO / "examples" / "hydra-app", Path(tmp) / "app"))
        rayflow, basic, ray_launcher = [], [], []
        peer = _peer(Path(args.ray_launcher_venv)) if args.ray_launcher_venv else None
        for _ in range(args.repeats):
            rayflow.append(
                _sweep(
                    app,
                    ["hydra/launcher=rayflow", f"hydra.launcher.num_cpus={SLOTS}"],
                    args.jobs,
                    args.job_seconds,
                )
            )
            basic.append(_sweep(app, ["hydra/launcher=basic"], args.jobs, args.job_seconds))
            if peer is not None:
                ray_launcher.append(
                    _sweep(
                        app,
                        ["hydra/launcher=ray", f"+hydra.launcher.ray.init.num_cpus={SLOTS}"],
                        args.jobs,
                        args.job_seconds,
                        str(peer),
                    )
                )
    ideal = args.jobs * args.job_seconds / SLOTS
    wall, plain = statistics.median(rayflow), statistics.median(basic)
    return {
        "name": "hydra-launcher",
        "benchmark": "hydra-launcher",  # the key this line had before `name`
        "jobs": args.jobs,
        "job_seconds": args.job_seconds,
        "slots": SLOTS,
        "repeats": args.repeats,
        "wall_s": round(wall, 2),
        "ideal_s": ideal,
        "ratio": round(wall / ideal, 3),
        "basic_wall_s": round(plain, 2),
        "speedup": round(plain / wall, 2),
        "ray_launcher_wall_s": round(statistics.median(ray_launcher), 2) if ray_launcher else None,
        "vs_ray_launcher": round(wall / statistics.median(ray_launcher), 3)
        if ray_launcher
        else None,
    }


# What Ray's own processes import where it is installed (its workers' serializers, its
# dashboard's data module): rayflow's venv has them, so the peer's venv gets the same versions,
# or its Ray would start lighter than the same Ray here (about a second of ray.init measured).
SAME_AS_HERE = ("numpy", "pandas", "pyarrow")


def _peer(venv: Path) -> Path:
    """Hydra's own Ray launcher, in a venv of its own (it pins its own Ray and Hydra), with this
    venv's versions of what Ray imports where present (SAME_AS_HERE)."""
    from importlib.metadata import version

    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "hydra-core", "hydra-ray-launcher==1.2.2"],
            check=True,
        )
    same = [f"{name}=={version(name)}" for name in SAME_AS_HERE]
    subprocess.run([str(python), "-m", "pip", "install", "-q", *same], check=True)
    return python


def hydra_launcher_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument(
        "--job-seconds", type=float, default=4.0, help="how long each job holds (the app's hold_s)"
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="runs of each launcher; the median is reported"
    )
    p.add_argument(
        "--ray-launcher-venv",
        default=None,
        help="a venv for hydra-ray-launcher (made on first use); without it, that side is left out",
    )
    smoke_option(p, jobs=2, job_seconds=0.5, repeats=1)
