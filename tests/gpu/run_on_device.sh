#!/bin/sh
# Runs every test that needs a CUDA GPU (marked `gpu`; they skip elsewhere), with their times and the
# latency lines they print.  From the repository root: tests/gpu/run_on_device.sh [pytest options]
set -e
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python -m pytest -m gpu -q -n 0 --durations=0 -rs tests/gpu "$@"
