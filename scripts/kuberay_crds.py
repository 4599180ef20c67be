"""Regenerate rayflow/backends/kuberay/crds/ from KubeRay's CRD YAML files.

    python scripts/kuberay_crds.py /path/to/ray.io_rayclusters.yaml /path/to/ray.io_rayjobs.yaml

The CRDs live in ray-project/kuberay under ray-operator/config/crd/bases/. Only the
openAPIV3Schema of version v1 is kept (v1alpha1 is not served to rayflow), and every schema
node's `description` is dropped: the descriptions are most of the file's size and the
validator never reads them. The output is gzipped JSON written byte-for-byte
deterministically (sorted keys, gzip mtime 0), so a regeneration from the same CRDs is a
no-op in git.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import yaml

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "rayflow" / "backends" / "kuberay" / "crds"
SERVED_VERSION = "v1"

# Keys of a schema node whose values are schemas (or lists of them). `properties` maps field
# names to schemas, so a field that happens to be called "description" survives.
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf")
_SCHEMA_VALUES = ("items", "additionalProperties", "not")


def strip_descriptions(node: dict) -> dict:
    """A copy of a schema node without `description`, recursing only into sub-schemas."""
    out = {}
    for key, value in node.items():
        if key == "description":
            continue
        if key == "properties":
            value = {name: strip_descriptions(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS:
            value = [strip_descriptions(sub) for sub in value]
        elif key in _SCHEMA_VALUES and isinstance(value, dict):
            value = strip_descriptions(value)
        out[key] = value
    return out


def extract_v1_schema(crd_path: str | Path) -> tuple[str, dict]:
    """(kind, the v1 openAPIV3Schema without descriptions) of one CRD file."""
    # libyaml's loader where built in: the CRDs are 1-1.4 MB, seconds for the pure-Python one.
    crd = yaml.load(
        Path(crd_path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    )
    if crd.get("kind") != "CustomResourceDefinition":
        raise SystemExit(f"{crd_path}: not a CustomResourceDefinition")
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    if SERVED_VERSION not in versions:
        raise SystemExit(f"{crd_path}: has no version {SERVED_VERSION} (has {sorted(versions)})")
    schema = versions[SERVED_VERSION]["schema"]["openAPIV3Schema"]
    return crd["spec"]["names"]["kind"], strip_descriptions(schema)


def schema_file_name(kind: str) -> str:
    return f"{kind.lower()}.{SERVED_VERSION}.json.gz"


def write_schema(schema: dict, path: Path) -> None:
    text = json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()
    # mtime=0 and no file name in the header: the same schema always gives the same bytes.
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "crds", nargs="+", help="CRD YAML files (ray.io_rayclusters.yaml, ray.io_rayjobs.yaml)"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for crd_path in args.crds:
        kind, schema = extract_v1_schema(crd_path)
        target = args.out / schema_file_name(kind)
        write_schema(schema, target)
        print(f"{crd_path} -> {target} ({target.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
