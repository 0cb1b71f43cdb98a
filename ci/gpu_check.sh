#!/usr/bin/env bash
# One script for a machine with an NVIDIA GPU: the test suite on both targets for real,
# then the GPU benchmark, then a summary. Uses the machine's python3 with numba, numba-cuda,
# numpy, torch, pytest, hypothesis, scipy and mpmath, and CuPy if present (installing steadystep is not needed:
# it runs from this tree). Usage: bash ci/gpu_check.sh [pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# A machine that cannot reach PyPI may hold a NumPy that its numba-cuda cannot compile with
# (numba-cuda 0.30 fails every compile with NumPy 2.5; this project's device image had NumPy
# 2.5.2 on Python 3.12). Wheels put in .whl/ (git-ignored) are installed over it first,
# e.g. fetched where PyPI is reachable (16 MB; carry .whl along):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d .whl numpy==2.4.6
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/steadystep-site \
        .whl/*.whl && export PYTHONPATH="/tmp/steadystep-site:$PYTHONPATH"
fi
python3 -m pip install -q --no-deps -e . 2>/dev/null || true
python3 - <<'PY'
import importlib.metadata as metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"
print("versions:", ", ".join(f"{name} {version(name)}" for name in ("numpy", "numba", "numba-cuda", "torch", "cupy-cuda13x")))
from numba import cuda
device = cuda.get_current_device()
print("GPU:", device.name, "compute capability", device.compute_capability)
PY
# tests/test_cupy.py runs CuPy arrays through the kernels for real when CuPy is installed
# (pip install -e '.[cupy]': cupy-cuda13x, built for the CUDA 13 runtime numba-cuda uses)
cupy="ran"
python3 -c "import cupy; assert cupy.cuda.is_available()" 2>/dev/null || cupy="SKIPPED: no usable cupy-cuda13x (pip install -e '.[cupy]')"
tests=0
STEADYSTEP_TEST_TARGETS=cpu,cuda python3 -m pytest tests -q -p no:cacheprovider -n 8 "$@" || tests=$?
bench=0
# every kernel's registers and resident blocks from the driver, beside ptxas's prediction
# (needs the nvidia-cuda-nvcc wheel's ptxas; the table is BENCHMARKS.md's "GPU kernel resources")
python3 -m benchmarks.kernel_resources --all --device || bench=$?
python3 -m benchmarks.adamw_gpu || bench=$?
python3 -m benchmarks.decentral_gpu || bench=$?
python3 -m benchmarks.rows_gpu || bench=$?
# the torch-module trainer: vmap against the loop over copies (target >= 3x on a GPU), the update against torch
python3 -m benchmarks.decentral_torch --device cuda || bench=$?
nccl=0
# one torch.distributed rank over NCCL: GPU rows handed to NCCL as the same memory, mixed on the
# GPU, DistributedAdamW and DistributedTrainer equal to the in-process steps bit for bit
python3 -m torch.distributed.run --standalone --nproc-per-node 1 ci/nccl_check.py || nccl=$?
demo=0
if python3 -c "import sklearn, matplotlib, rich" 2>/dev/null; then
    # the main job on the GPU (defaults otherwise), timed with compilation included
    time python3 -m steadystep demo --device cuda --no-progress --output-dir "${TMPDIR:-/tmp}/steadystep-gpu-demo" || demo=$?
    # the language-model main job: a torch byte transformer, its 8 workers' kernels on the GPU
    time python3 -m steadystep demo --task lm --device cuda --no-progress --output-dir "${TMPDIR:-/tmp}/steadystep-gpu-demo-lm" || demo=$?
else
    echo "demo skipped: scikit-learn, matplotlib or rich missing (pip install -e '.[demo]')"
fi
echo "gpu_check: tests exit $tests (CuPy cases: $cupy), benchmark exit $bench, nccl exit $nccl, demo exit $demo"
exit $(( tests || bench || nccl || demo ))
