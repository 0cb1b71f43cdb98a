#!/usr/bin/env bash
# One script for a machine with an NVIDIA GPU: run the CUDA tests for real, then the GPU
# benchmarks, and print a summary. Needs numba, numba-cuda, numpy, pytest, hypothesis,
# scipy, mpmath (and torch/CuPy for the peers); installs steadystep itself from this tree.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'PY'
from numba import cuda
print("GPU:", cuda.get_current_device().name, "compute capability", cuda.get_current_device().compute_capability)
PY
status=0
STEADYSTEP_TEST_TARGETS=cpu,cuda python3 -m pytest tests -q -p no:cacheprovider -x || status=$?
for benchmark in benchmarks/*_gpu.py; do
  [ -e "$benchmark" ] && { python3 "$benchmark" || status=$?; }
done
echo "gpu_check: exit status $status"
exit $status
