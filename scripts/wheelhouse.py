"""The wheelhouse behind scripts/wheelhouse.sh: every wheel rayflow needs on a target Python
and platform, for `pip install --no-index --find-links DIR` on a machine without a registry.

How it works, on a machine that has a registry (pip's own configuration is used):
1. rayflow's wheel is built (`pip wheel --no-deps`, from a copy of the repository).
2. Its requirements (with --extras) are resolved for the target by pip itself
   (`pip install --dry-run --report`, --only-binary=:all:, --python-version, --platform), in a
   throwaway environment where each package of --have (the target's `pip list --format=freeze`)
   is installed as an empty stub: pip counts them as there when their versions fit, so neither
   they nor what only they need (torch's CUDA libraries) enter the set. A version that does not
   fit is resolved like any missing package (and then installed over the target's).
3. pip evaluates environment markers for the Python it runs on, not for --python-version, so
   the result is walked again from rayflow's requirements with the target's markers: what the
   target needs beyond it is resolved in another round, what it does not need is dropped.
4. `pip download --no-deps` fetches exactly that set; --slim-ray repacks Ray's wheel without
   ray/jars/ (Java workers only) and the dashboard's *.map source maps, with a new RECORD.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHES = ("x86_64", "aarch64")
# What the target gets instead of `mlflow` (the server with its UI, ~18 MB of wheels plus Flask,
# gunicorn, scikit-learn, ...): `local` the client with SQLite/file stores, `client` the client alone.
MLFLOW_MODES = {
    "full": [],
    "local": ["sqlalchemy>=1.4.0,<3", "alembic!=1.10.0,<2"],
    "client": [],
}
SLIM_RAY_DROPS = ("ray/jars/",)


def log(msg: str) -> None:
    print(f"wheelhouse: {msg}", file=sys.stderr, flush=True)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def platform_tags(arch: str, glibc: str) -> list[str]:
    """Every manylinux tag a target with this glibc accepts (pip matches tags exactly)."""
    major, minor = (int(x) for x in glibc.split("."))
    if major != 2 or minor < 5:
        raise SystemExit(f"wheelhouse: --glibc {glibc}: expected 2.N with N >= 5")
    tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [
        f"{name}_{arch}"
        for n, name in legacy.items()
        if n <= minor and (arch == "x86_64" or n >= 17)
    ]
    return tags


def marker_env(python: str, arch: str) -> dict[str, str]:
    """The environment markers of a CPython `python` (X.Y) on Linux/`arch`."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": arch,
        "platform_release": "",
        "platform_version": "",
    }


def _packaging():
    try:
        from packaging.markers import Marker  # noqa: F401
        from packaging.requirements import Requirement
    except ImportError:  # pip always carries it
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def read_have(paths: list[str]) -> dict[str, tuple[str, str]]:
    """canonical name -> (name, version) from `pip list --format=freeze` / `pip freeze` files."""
    have: dict[str, tuple[str, str]] = {}
    for path in paths:
        for raw in Path(path).read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*([^\s;]+)", line)
            if not match:
                raise SystemExit(
                    f"wheelhouse: {path}: {raw!r} is not NAME==VERSION "
                    "(make the file with `python -m pip list --format=freeze` on the target)"
                )
            have[canonical(match.group(1))] = (match.group(1), match.group(2))
    return have


def walk(roots: list[str], items: dict, have: dict, env: dict):
    """From the root requirements through the resolved items, with the target's markers.

    Returns (needed item names, names the target's packages satisfy, requirements nothing
    covers). `items`: canonical name -> {"version", "requires_dist"}.
    """
    Requirement = _packaging()
    needed, from_have, missing = set(), set(), []
    seen: set[tuple[str, frozenset]] = set()
    queue = [(Requirement(r), frozenset()) for r in roots]
    while queue:
        req, parent_extras = queue.pop()
        if req.marker is not None:
            extras = parent_extras or {""}
            if not any(req.marker.evaluate({**env, "extra": extra}) for extra in extras):
                continue
        name = canonical(req.name)
        if name in items:
            needed.add(name)
            key = (name, frozenset(canonical(e) for e in req.extras))
            if key in seen:
                continue
            seen.add(key)
            for dep in items[name].get("requires_dist") or []:
                queue.append((Requirement(dep), key[1]))
        elif name in have:
            from_have.add(name)
        else:
            missing.append(str(req).split(";")[0].strip())
    return needed, from_have, missing


def stub_environment(folder: Path, have: dict) -> Path:
    """A venv whose site-packages holds one empty distribution per package of `have`; returns
    its python. Its pip is upgraded (pip < 24 refuses --platform without --target)."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--upgrade", "pip>=24.2"], check=True)
    # a stub may take its place
    subprocess.run([*pip, "uninstall", "-y", "setuptools"], check=False, capture_output=True)
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for name, version in have.values():
        if canonical(name) == "pip":  # the resolver's own
            continue
        dist = site / f"{canonical(name).replace('-', '_')}-{version}.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (dist / "INSTALLER").write_text("rayflow-wheelhouse-stub\n")
    return python


def target_args(args) -> list[str]:
    out = ["--only-binary=:all:", "--python-version", args.python, "--implementation", "cp"]
    for tag in platform_tags(args.arch, args.glibc):
        out += ["--platform", tag]
    return out


def resolve(python: Path, requirements: list[str], args, work: Path, native: bool = False) -> dict:
    """pip's resolution of `requirements` for the target (native: for this machine, sdists
    allowed): canonical name -> item."""
    report = work / "report.json"
    where = [] if native else [*target_args(args), "--find-links", str(work / "built")]
    cmd = [
        str(python),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--quiet",
        "--dry-run",
        "--report",
        str(report),
        *where,
        *requirements,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        errors = [
            l for l in out.stderr.splitlines() if l.startswith("ERROR") or "conflict" in l.lower()
        ]
        raise SystemExit(
            "wheelhouse: pip could not resolve the set for the target:\n"
            + "\n".join(errors or out.stderr.splitlines()[-15:])
        )
    items = {}
    for entry in json.loads(report.read_text())["install"]:
        meta = entry["metadata"]
        items[canonical(meta["name"])] = {
            "name": meta["name"],
            "version": meta["version"],
            "requires_dist": meta.get("requires_dist") or [],
            "url": entry.get("download_info", {}).get("url", ""),
        }
    return items


def build_sdist_only(python: Path, requirements: list[str], args, work: Path) -> list[str]:
    """Packages published as source only (hydra-core's antlr4-python3-runtime): built here into
    wheels under work/built, which the target resolution and download then find. Only pure-Python
    ones (py3-none-any) can serve another platform."""
    built = work / "built"
    built.mkdir(exist_ok=True)
    sources = [
        f"{i['name']}=={i['version']}"
        for i in resolve(python, requirements, args, work, native=True).values()
        if i["url"]
        and not i["url"].split("#")[0].endswith(".whl")
        and not i["url"].startswith("file:")
    ]
    for pin in sources:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--disable-pip-version-check",
                "-q",
                "--no-deps",
                "-w",
                str(built),
                pin,
            ],
            check=True,
        )
    for wheel in built.glob("*.whl"):
        if not wheel.name.endswith("-none-any.whl"):
            raise SystemExit(
                f"wheelhouse: {wheel.name} has no published wheel and builds only for this platform"
            )
    return sources


def wheel_requirements(wheel: Path, extras: list[str], env: dict) -> list[str]:
    """The Requires-Dist of a wheel that apply with these extras on the target."""
    Requirement = _packaging()
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(
            req.marker.evaluate({**env, "extra": e}) for e in ["", *extras]
        ):
            req.marker = None
            out.append(str(req))
    return out


def build_rayflow(out: Path) -> Path:
    """rayflow's own wheel (conf/ and backends/ inside), built from a copy of the repository."""
    with tempfile.TemporaryDirectory(prefix="rayflow-wheel-") as tmp:
        source = Path(tmp) / "source"
        shutil.copytree(
            REPO,
            source,
            ignore=shutil.ignore_patterns(
                ".git",
                ".venv",
                "venv",
                "build",
                "dist",
                "*.egg-info",
                "__pycache__",
                "outputs",
                "multirun",
                "mlruns",
                "mlflow.db",
                "wheelhouse",
                ".gpu",
                ".whl",
                ".gl",
            ),
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--disable-pip-version-check",
                "-q",
                "--no-deps",
                "-w",
                str(out),
                str(source),
            ],
            check=True,
        )
    return next(out.glob("rayflow-*.whl"))


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def slim_wheel(wheel: Path, drop=lambda name: False, note: str = "") -> tuple[int, int]:
    """Rewrite `wheel` in place without the files `drop` selects, with a RECORD that lists what
    is left (path, sha256, size), so pip installs it as it would the original. Returns
    (files dropped, bytes saved in the wheel)."""
    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".slim")
    dropped = 0
    with (
        zipfile.ZipFile(wheel) as zin,
        zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zout,
    ):
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        dist_info = record_name.rsplit("/", 1)[0]
        rows = []
        for info in zin.infolist():
            name = info.filename
            if name == record_name:
                continue
            if drop(name):
                dropped += 1
                continue
            data = zin.read(info)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            if not name.endswith("/"):
                rows.append((name, _record_hash(data), str(len(data))))
        if note:
            name = f"{dist_info}/SLIMMED"
            data = note.encode()
            zout.writestr(name, data)
            rows.append((name, _record_hash(data), str(len(data))))
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerows(rows + [(record_name, "", "")])
        zout.writestr(record_name, buffer.getvalue())
    tmp.replace(wheel)
    return dropped, before - wheel.stat().st_size


def slim_ray_drop(name: str) -> bool:
    return name.startswith(SLIM_RAY_DROPS) or (
        name.startswith("ray/dashboard/") and name.endswith(".map")
    )


def split(out: Path, wheels: list[Path], limit_mb: float) -> list[Path]:
    """Move the wheels into out/part-1, part-2, ... of at most limit_mb MiB each (first fit,
    largest first); returns the folders."""
    limit = limit_mb * 2**20
    bins: list[list[Path]] = []
    for wheel in sorted(wheels, key=lambda w: -w.stat().st_size):
        size = wheel.stat().st_size
        if size > limit:
            raise SystemExit(
                f"wheelhouse: {wheel.name} alone ({size / 2**20:.1f} MiB) is more than --split-mb {limit_mb:g}"
            )
        for group in bins:
            if sum(w.stat().st_size for w in group) + size <= limit:
                group.append(wheel)
                break
        else:
            bins.append([wheel])
    folders = []
    for n, group in enumerate(bins, 1):
        folder = out / f"part-{n}"
        folder.mkdir(exist_ok=True)
        for wheel in group:
            wheel.replace(folder / wheel.name)
        folders.append(folder)
    return folders


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="scripts/wheelhouse.sh",
        description="Build the wheels rayflow needs on a target Python/platform, for "
        "`pip install --no-index --find-links DIR` on an air-gapped machine.",
    )
    p.add_argument(
        "-o",
        "--out",
        default="wheelhouse",
        help="the folder for the wheels (its old *.whl are removed)",
    )
    p.add_argument(
        "--python",
        default=f"{sys.version_info.major}.{sys.version_info.minor}",
        help="the target's Python, X.Y (default: this one's)",
    )
    p.add_argument("--arch", default="x86_64", choices=ARCHES, help="the target's processor")
    p.add_argument(
        "--glibc",
        default="2.28",
        help="the target's glibc (ldd --version): newest manylinux tag accepted",
    )
    p.add_argument(
        "--extras",
        default="rllib",
        help="rayflow extras, comma-separated (default rllib: workload=ppo); '' for none",
    )
    p.add_argument(
        "--have",
        action="append",
        default=[],
        metavar="FILE",
        help="the target's `python -m pip list --format=freeze`: what it has is left out (repeatable)",
    )
    p.add_argument(
        "--slim-ray",
        action="store_true",
        help="Ray without ray/jars/ (Java workers only) and the dashboard's *.map files",
    )
    p.add_argument(
        "--mlflow",
        default="full",
        choices=tuple(MLFLOW_MODES),
        help="full: mlflow (server and UI); local: mlflow-skinny + SQLAlchemy + Alembic (the client with "
        "SQLite or file stores); client: mlflow-skinny alone (a tracking server elsewhere)",
    )
    p.add_argument(
        "--max-mb", type=float, help="fail when the wheels total more than this many MiB"
    )
    p.add_argument(
        "--split-mb",
        type=float,
        metavar="MB",
        help="spread the wheels over DIR/part-1, part-2, ... of at most MB MiB each (for a transfer limit)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="resolve and list the set; download nothing"
    )
    args = p.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python):
        p.error(f"--python {args.python}: expected 3.N")
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    have = read_have(args.have)
    if "spark" in extras and "pyspark" not in have:
        p.error(
            "--extras spark: pyspark is published as an sdist only, which a wheelhouse for another platform "
            "cannot resolve; list the target's pyspark with --have, or build its wheel with `pip wheel pyspark`"
        )
    env = marker_env(args.python, args.arch)
    out = Path(args.out).resolve()

    with tempfile.TemporaryDirectory(prefix="rayflow-wheelhouse-") as tmp:
        work = Path(tmp)
        log("building rayflow's wheel")
        rayflow_wheel = build_rayflow(work / "rayflow")
        roots = wheel_requirements(rayflow_wheel, extras, env)
        if args.mlflow != "full":  # the same version range, without the server
            Requirement = _packaging()
            roots = [
                f"mlflow-skinny{Requirement(r).specifier}"
                if canonical(Requirement(r).name) == "mlflow"
                else r
                for r in roots
            ]
            roots += MLFLOW_MODES[args.mlflow]
        log(
            f"resolving for CPython {args.python} on manylinux {args.arch} (glibc {args.glibc}): "
            + " ".join(roots)
        )
        python = stub_environment(work / "stubs", have)
        built = build_sdist_only(python, roots, args, work)
        if built:
            log("published as source only, built here as pure-Python wheels: " + " ".join(built))
        asked = list(roots)
        for _ in range(5):
            items = resolve(python, asked, args, work)
            needed, from_have, missing = walk(roots, items, have, env)
            if not missing:
                break
            log(
                "needed under Python "
                + args.python
                + "'s markers, resolving too: "
                + " ".join(missing)
            )
            asked += [m for m in missing if m not in asked]
        else:
            raise SystemExit(
                "wheelhouse: the set does not close under the target's markers: "
                + " ".join(missing)
            )
        pins = sorted(f"{items[n]['name']}=={items[n]['version']}" for n in needed)
        upgraded = sorted(
            f"{items[n]['name']} {have[n][1]} -> {items[n]['version']}" for n in needed if n in have
        )
        left_out = sorted(f"{have[n][0]}=={have[n][1]}" for n in from_have)
        unneeded = sorted(n for n in items if n not in needed)
        if unneeded:
            log(
                f"not needed on Python {args.python} (only under this Python's markers): {' '.join(unneeded)}"
            )

        if args.dry_run:
            print("\n".join(["rayflow (built here)", *pins]))
            print(
                f"\n{len(pins) + 1} wheels; left out, the target has them: {', '.join(left_out) or 'nothing'}"
            )
            return 0

        out.mkdir(parents=True, exist_ok=True)
        for old in [
            *out.glob("*.whl"),
            *out.glob("part-*/*.whl"),
        ]:  # one version of each: two stop an install
            old.unlink()
        for part in out.glob("part-*"):
            part.rmdir()
        log(f"downloading {len(pins)} wheels into {out}")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--disable-pip-version-check",
                "-q",
                "--no-deps",
                *target_args(args),
                "--find-links",
                str(work / "built"),
                "-d",
                str(out),
                *pins,
            ],
            check=True,
        )
        shutil.copy2(rayflow_wheel, out / rayflow_wheel.name)

    notes = []
    if args.slim_ray:
        for wheel in out.glob("ray-*.whl"):
            full = wheel.stat().st_size
            count, saved = slim_wheel(
                wheel,
                slim_ray_drop,
                note="Repacked by rayflow's scripts/wheelhouse.sh --slim-ray: without ray/jars/ "
                "(Java workers) and the dashboard's *.map source maps.\n",
            )
            notes.append(
                f"{wheel.name}: {full / 2**20:.1f} MiB -> {wheel.stat().st_size / 2**20:.1f} MiB "
                f"(--slim-ray: {count} files of ray/jars/ and dashboard *.map left out)"
            )

    wheels = sorted(out.glob("*.whl"), key=lambda w: -w.stat().st_size)
    total = sum(w.stat().st_size for w in wheels)
    print(f"{'MiB':>7}  wheel")
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:7.2f}  {w.name}")
    print(f"{total / 2**20:7.2f}  total, {len(wheels)} wheels in {out}")
    for note in notes:
        print(note)
    parts = split(out, wheels, args.split_mb) if args.split_mb else []
    for part in parts:
        print(
            f"{sum(w.stat().st_size for w in part.glob('*.whl')) / 2**20:7.2f}  {part.name}/ ({len(list(part.glob('*.whl')))} wheels)"
        )
    print(f"left out, the target has them (--have): {', '.join(left_out) or 'nothing'}")
    if upgraded:
        print(
            f"newer than the target's (included; pip will replace them there): {', '.join(upgraded)}"
        )
    if args.mlflow != "full":
        print(
            f"--mlflow {args.mlflow}: mlflow-skinny instead of mlflow (no server or UI); rayflow's wheel still names "
            "`mlflow`, so install with --no-deps as below"
        )
    spec = f"rayflow[{','.join(extras)}]" if extras else "rayflow"
    folders = [f"{out.name}/{part.name}" for part in parts] or [out.name]
    if args.mlflow == "full":
        links = " ".join(f"--find-links {f}" for f in folders)
        print(f"install there:  python -m pip install --no-index {links} '{spec}'")
    else:
        print(
            f"install there:  python -m pip install --no-index --no-deps {' '.join(f + '/*.whl' for f in folders)}"
        )
    if args.max_mb is not None and total > args.max_mb * 2**20:
        print(
            f"wheelhouse: {total / 2**20:.1f} MiB is more than --max-mb {args.max_mb:g}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
