#!/usr/bin/env bash
# Offline install for air-gapped (GPU) nodes: builds every wheel rayflow needs for a target
# Python and platform into one folder, for `pip install --no-index --find-links DIR` there.
# Run it where pip reaches a package index; the logic is in scripts/wheelhouse.py.
#
#   # on the target: what it already has (torch, numpy, ... are then left out)
#   python3 -m pip list --format=freeze > have.txt
#   # here: CPython 3.12 on manylinux x86_64 (glibc 2.35 or newer), Ray without its Java jars
#   bash scripts/wheelhouse.sh --python 3.12 --glibc 2.35 --have have.txt --slim-ray -o wheelhouse
#   # there (after copying wheelhouse/):
#   python3 -m pip install --no-index --find-links wheelhouse 'rayflow[rllib]'
#
# Options: -o DIR, --python X.Y, --arch x86_64|aarch64, --glibc 2.N, --extras rllib[,spark],
# --have FILE (repeatable), --slim-ray, --mlflow full|local|client, --max-mb N, --dry-run;
# --help explains each. PYTHON picks the interpreter that runs it (default: .venv's, else python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$here/../.venv/bin/python" ]; then python="$here/../.venv/bin/python"; else python=python3; fi
fi
exec "$python" "$here/wheelhouse.py" "$@"
