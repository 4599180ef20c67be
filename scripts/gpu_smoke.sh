#!/usr/bin/env bash
# GPU smoke test: each workload briefly with compute=gpu on the local backend, on this machine's
# GPU, checked from the outside; prints a table (workload, GPU model, wall time, result).
#   cifar  2 trials x 1 epoch sharing one GPU (workload.resources_per_trial.gpu=0.5)
#   ddp    1 GPU worker (NCCL) x 1 epoch with AMP
#   ppo    3 iterations with the PPO learner on the GPU
# Each must exit 0, report the GPU's model from inside its trials/workers (MLflow tag
# device_name), write checkpoints and leave finished runs in MLflow.
# Exit 0: all passed; 1: something failed (the runs are kept); 2: nothing could run (no CUDA
# device, rayflow not installed), said in one line.
#   bash scripts/gpu_smoke.sh [--workloads cifar,ddp,ppo] [--workdir DIR] [--timeout S]
# PYTHON picks the interpreter (default: the repository's .venv, else python3).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$here/../.venv/bin/python" ]; then python="$here/../.venv/bin/python"; else python=python3; fi
fi
exec "$python" "$here/gpu_smoke.py" "$@"
