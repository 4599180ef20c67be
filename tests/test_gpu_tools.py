"""The GPU tools' CPU side (fast, offline, run by CI): the smoke script's refusal without a GPU
and its command lines,
the wheelhouse's pieces (slim repack, marker walk, platform tags, --have files) and the
benchmark's torchvision copy of the synthetic set."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from tests.harness import REPO


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheelhouse = load_script("wheelhouse")


def test_smoke_script_refuses_without_a_gpu_in_one_line():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the smoke script would run")
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_smoke.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHON=sys.executable),
    )
    assert out.returncode == 2
    assert out.stdout == ""
    assert (
        out.stderr.startswith("gpu_smoke: no CUDA device")
        and len(out.stderr.strip().splitlines()) == 1
    )
    assert "Traceback" not in out.stderr


def test_smoke_script_rejects_an_unknown_workload():
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_smoke.sh"), "--workloads", "cifar,nope"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHON=sys.executable),
    )
    assert out.returncode == 2 and "--workloads: choose from cifar, ddp, ppo" in out.stderr


def test_each_smoke_command_composes(tmp_path):
    """What the GPU machine runs, checked here: each workload's command line is a valid config
    (a key a preset does not have would fail there in its first second)."""
    from rayflow.orchestrator.compose import compose_config

    smoke = load_script("gpu_smoke")
    for name in smoke.WORKLOADS:
        cfg = compose_config(*smoke.overrides(name, tmp_path, tmp_path / name))
        assert cfg.workload.name == name and cfg.compute.device == "cuda"


def make_wheel(path, files: dict[str, bytes]):
    """A wheel of the distribution `ray` 0.0.1 holding `files`, with a correct RECORD."""
    meta = {
        "ray-0.0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: ray\nVersion: 0.0.1\n",
        "ray-0.0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in {**files, **meta}.items():
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(data)}")
        z.writestr(
            "ray-0.0.1.dist-info/RECORD", "\n".join(rows + ["ray-0.0.1.dist-info/RECORD,,"]) + "\n"
        )


def test_slim_ray_drops_jars_and_source_maps_with_a_new_record_pip_installs(tmp_path):
    wheel = tmp_path / "ray-0.0.1-py3-none-any.whl"
    make_wheel(
        wheel,
        {
            "ray/__init__.py": b"VERSION = '0.0.1'\n",
            "ray/jars/ray_dist.jar": os.urandom(4096),
            "ray/dashboard/client/build/static/js/main.js": b"console.log(1)\n",
            "ray/dashboard/client/build/static/js/main.js.map": b"{}" * 1000,
            "ray/util/helper.map.py": b"x = 1\n",  # a .map that is not the dashboard's stays
        },
    )
    dropped, saved = wheelhouse.slim_wheel(wheel, wheelhouse.slim_ray_drop, note="slimmed\n")
    assert dropped == 2 and saved > 0
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = list(csv.reader(io.StringIO(z.read("ray-0.0.1.dist-info/RECORD").decode())))
        for name, digest, size in record:
            if name.endswith("RECORD"):
                assert digest == "" and size == ""
                continue
            data = z.read(name)
            assert (
                digest
                == "sha256="
                + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            )
            assert int(size) == len(data)
    assert {row[0] for row in record} == names
    assert (
        "ray/jars/ray_dist.jar" not in names
        and "ray/dashboard/client/build/static/js/main.js.map" not in names
    )
    assert {
        "ray/dashboard/client/build/static/js/main.js",
        "ray/util/helper.map.py",
        "ray-0.0.1.dist-info/SLIMMED",
    } <= names

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        timeout=120,
    )
    assert (target / "ray" / "__init__.py").is_file() and not (target / "ray" / "jars").exists()


def test_walk_keeps_what_the_target_python_needs():
    env = wheelhouse.marker_env("3.12", "x86_64")
    items = {
        "a": {
            "requires_dist": [
                "b; python_version >= '3.12'",
                "c; python_version < '3.12'",
                "d[x]",
                "torch>=2",
            ]
        },
        "b": {"requires_dist": []},
        "c": {"requires_dist": []},
        "d": {
            "requires_dist": ["e; extra == 'x'", "f; extra == 'y'", "h>=1; sys_platform == 'linux'"]
        },
        "e": {"requires_dist": []},
        "f": {"requires_dist": []},
    }
    needed, from_have, missing = wheelhouse.walk(["a"], items, {"torch": ("torch", "2.11.0")}, env)
    assert needed == {"a", "b", "d", "e"}  # c: only below 3.12; f: extra y not asked for
    assert from_have == {"torch"}
    assert missing == ["h>=1"]  # needed on the target, not resolved: another round resolves it


def test_platform_tags_cover_older_manylinux_only():
    tags = wheelhouse.platform_tags("x86_64", "2.28")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(
        tags
    ) and "manylinux_2_29_x86_64" not in tags
    assert "manylinux1_aarch64" not in wheelhouse.platform_tags("aarch64", "2.28")


def test_have_file_is_pip_freeze(tmp_path):
    have = tmp_path / "have.txt"
    have.write_text("# the target\ntorch==2.11.0+cu130\nPyYAML==6.0.3\n\n")
    assert wheelhouse.read_have([str(have)]) == {
        "torch": ("torch", "2.11.0+cu130"),
        "pyyaml": ("PyYAML", "6.0.3"),
    }
    have.write_text("numpy\n")
    with pytest.raises(SystemExit, match="not NAME==VERSION"):
        wheelhouse.read_have([str(have)])


def test_wheelhouse_script_help():
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "wheelhouse.sh"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHON=sys.executable),
    )
    assert out.returncode == 0 and "--slim-ray" in out.stdout and "--have" in out.stdout


def test_benchmark_seed_side_reads_the_same_synthetic_images(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        bench_data = load_script("bench_data")
    finally:
        sys.path.remove(str(REPO / "scripts"))
    from rayflow.workloads.presets.cifar_data import TRAIN_FILES, DataSpec, prepare, read_batches

    batch_dir = prepare(
        DataSpec(
            root=str(tmp_path), synthetic=True, synthetic_train_size=200, synthetic_test_size=50
        )
    )
    copy = bench_data.torchvision_copy(batch_dir)
    assert copy.parent.name == "torchvision-copy" and copy.name == "cifar-10-batches-py"
    # read as torchvision's CIFAR10 does: latin1 pickles with str keys
    images, labels = [], []
    for name in TRAIN_FILES:
        with open(copy / name, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        images.append(entry["data"])
        labels += entry["labels"]
    with open(copy / "batches.meta", "rb") as f:
        assert pickle.load(f, encoding="latin1")["label_names"][0] == "class0"
    x, y = read_batches(batch_dir, TRAIN_FILES)
    assert np.array_equal(np.vstack(images).reshape(-1, 3, 32, 32), x) and labels == y.tolist()
