#!/usr/bin/env bash
# One script for a machine with an NVIDIA GPU: the target tests on the GPU for real (the CPU
# ones run in CI), the GPU benchmarks, the NCCL rank, the demos, then a summary. Uses the
# machine's python3 with numba, numba-cuda, numpy, torch, pytest, pytest-xdist, hypothesis,
# scipy and mpmath, and CuPy if present (installing steadystep is not needed: it runs from
# this tree). Every part has a time limit, so that the whole fits a 10-minute lease; each
# part's output also goes to $LOGS/<part>.log (a temporary folder unless LOGS is set), and
# where $OUT is set (a lent machine's folder of files that come back) they are packed into
# $OUT/gpu_check_logs.tgz as they come.
# Usage: bash ci/gpu_check.sh [pytest args]
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
LOGS=${LOGS:-$(mktemp -d)}
mkdir -p "$LOGS"
echo "gpu_check: logs in $LOGS"
# part NAME SECONDS COMMAND...: runs COMMAND under a time limit, its output to the screen and
# NAME.log; the logs so far are packed into $OUT after each part (a lease cut short keeps them)
part() {
    local name=$1 limit=$2 status
    shift 2
    timeout "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
    status=${PIPESTATUS[0]}
    [ -z "${OUT:-}" ] || tar -czf "$OUT/gpu_check_logs.tgz" -C "$LOGS" .
    return "$status"
}
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
# the tests that take the target fixture, on the GPU; the CPU-only ones skip themselves
STEADYSTEP_TEST_TARGETS=cuda part tests 220 python3 -m pytest tests -q -p no:cacheprovider -n "$(nproc)" \
    -o timeout=150 --durations=15 "$@" || tests=$?
bench=0
# where a small call's microseconds go on the host (the row functions sat at 190 µs on an H200)
part launch_gpu 30 python3 -m benchmarks.launch_gpu || bench=$?
part adamw_gpu 40 python3 -m benchmarks.adamw_gpu || bench=$?
part decentral_gpu 30 python3 -m benchmarks.decentral_gpu || bench=$?
part rows_gpu 30 python3 -m benchmarks.rows_gpu || bench=$?
# the torch-module trainer: vmap against the loop over copies (target >= 3x on a GPU), the update against torch
part decentral_torch 40 python3 -m benchmarks.decentral_torch --device cuda --quick || bench=$?
# Nsight Compute on an 8-bit and a 4-bit AdamW step's two kernels (the 8-bit's third step): where a
# blockwise step's time goes (an H200 read them issue-bound: DRAM 6-14%, SM 64%)
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
if [ -n "$ncu_bin" ]; then
    part ncu_low_bit 45 "$ncu_bin" --clock-control none -k regex:blockwise --launch-skip 4 --launch-count 4 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        python3 ci/low_bit_steps.py || bench=$?
else
    echo "ncu_low_bit skipped: no Nsight Compute (ncu) on the PATH"
fi
# (benchmarks.kernel_resources --device, the driver's registers beside ptxas's, compiles all
# 280 kernels: over 110 s on an H200's host, more than this lease has; run it by hand)
nccl=0
# one torch.distributed rank over NCCL: GPU rows handed to NCCL as the same memory, mixed on the
# GPU, DistributedAdamW and DistributedTrainer equal to the in-process steps bit for bit
part nccl 30 python3 -m torch.distributed.run --standalone --nproc-per-node 1 ci/nccl_check.py || nccl=$?
demo=0
if python3 -c "import sklearn, matplotlib, rich" 2>/dev/null; then
    # the main job on the GPU (defaults otherwise), and the language-model main job (a torch
    # byte transformer, its 8 workers' kernels on the GPU), timed with compilation included
    part demo 50 python3 -m steadystep demo --device cuda --no-progress --output-dir "${TMPDIR:-/tmp}/steadystep-gpu-demo" || demo=$?
    part demo_lm 50 python3 -m steadystep demo --task lm --device cuda --no-progress \
        --output-dir "${TMPDIR:-/tmp}/steadystep-gpu-demo-lm" || demo=$?
else
    echo "demo skipped: scikit-learn, matplotlib or rich missing (pip install -e '.[demo]')"
fi
echo "gpu_check: tests exit $tests (CuPy cases: $cupy), benchmark exit $bench, nccl exit $nccl, demo exit $demo"
exit $(( tests || bench || nccl || demo ))
