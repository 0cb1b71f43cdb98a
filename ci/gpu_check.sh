#!/usr/bin/env bash
# One script for a machine with an NVIDIA GPU: the test suite on both targets for real,
# then the GPU benchmark, then a summary. Uses the machine's python3 with numba, numba-cuda,
# numpy, torch, pytest, hypothesis, scipy and mpmath (installing steadystep is not needed:
# it runs from this tree). Usage: bash ci/gpu_check.sh [pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps -e . 2>/dev/null || true
python3 - <<'PY'
from numba import cuda
device = cuda.get_current_device()
print("GPU:", device.name, "compute capability", device.compute_capability)
PY
tests=0
STEADYSTEP_TEST_TARGETS=cpu,cuda python3 -m pytest tests -q -p no:cacheprovider -n 8 "$@" || tests=$?
bench=0
python3 -m benchmarks.adamw_gpu || bench=$?
python3 -m benchmarks.decentral_gpu || bench=$?
demo=0
if python3 -c "import sklearn, matplotlib, rich" 2>/dev/null; then
    # the main job on the GPU (defaults otherwise), timed with compilation included
    time python3 -m steadystep demo --device cuda --no-progress --output-dir "${TMPDIR:-/tmp}/steadystep-gpu-demo" || demo=$?
else
    echo "demo skipped: scikit-learn, matplotlib or rich missing (pip install -e '.[demo]')"
fi
echo "gpu_check: tests exit $tests, benchmark exit $bench, demo exit $demo"
exit $(( tests || bench || demo ))
