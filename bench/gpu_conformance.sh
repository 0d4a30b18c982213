#!/usr/bin/env bash
# The conformance suite on a lent GPU machine: torch's CUDA paths one process each, JAX (xla, cuDNN),
# flax, equinox and transformers on the GPU, the float32 agreement checks with TF32 allowed, and the
# two grid scripts of tests/gpu (larger shapes than the ci profile draws).
# Runs with that machine's own python3 (torch, jax, pytest, hypothesis preinstalled). The jobs run at
# the same time, one process each, so one call of the device tool covers them all: a CUDA fault
# (cuDNN "misaligned address" was seen on an H100) poisons only its own process. Every pytest job
# stops itself through --run-timeout (its run file then says INCOMPLETE and names what was not run);
# `timeout` is the backstop. Everything lands in $OUT/runs and, packed, in $OUT/gpu-runs.tar.gz.
#
#   OUT=/tmp/gpu LIMIT=420 bash bench/gpu_conformance.sh
set -u
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
       XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
OUT=${OUT:-/tmp/attnconf-gpu}
RUNS="$OUT/runs"
LIMIT=${LIMIT:-420}        # seconds of tests per job
mkdir -p "$RUNS"
bash bench/install_checkout.sh python3 || exit 2
export VERIFY_BUDGET_S=$LIMIT
{
  python3 -c "import sys, torch, jax, hypothesis, pytest, ml_dtypes; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'jax', jax.__version__, 'hypothesis', hypothesis.__version__, 'pytest', pytest.__version__)"
  python3 -c "import transformers, flax, equinox; print('transformers', transformers.__version__, 'flax', flax.__version__, 'equinox', equinox.__version__)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
} 2>&1 | tee "$RUNS/environment.txt"

job() {  # name args...: one pytest process in the background
  local name=$1; shift
  (
    t0=$(date +%s)
    timeout $((LIMIT + 60)) python3 -m pytest conformance "$@" --hypothesis-profile=ci -q -p no:cacheprovider \
        --run-timeout="$LIMIT" --report="$RUNS/$name.json" --failures-dir="$RUNS/failures-$name" > "$RUNS/$name.log" 2>&1
    echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a "$RUNS/jobs.txt"
  ) &
}
script() {  # name command...: one grid script in the background
  local name=$1; shift
  (
    t0=$(date +%s)
    timeout $((LIMIT + 60)) "$@" > "$RUNS/$name.log" 2>&1
    echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a "$RUNS/jobs.txt"
  ) &
}

for impl in ${TORCH_IMPLS:-sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn mha}; do
  job "torch-cuda-$impl" --backend=torch --device=cuda --impl="torch:$impl"
done
# flex compiles every new shape with Triton: four workers share the compiles
[ -n "${FLEX-1}" ] && job torch-cuda-flex --backend=torch --device=cuda --impl=torch:flex -n 4
[ -n "${TF32-1}" ] && job torch-cuda-tf32 --backend=torch --device=cuda --allow-tf32 \
    --impl=torch:sdpa-math,torch:sdpa-efficient,torch:sdpa-cudnn -k "agreement or tolerance"
for b in ${JAX_BACKENDS:-jax flax equinox}; do job "$b-gpu" --backend="$b" --device=gpu; done
[ -n "${TRANSFORMERS-1}" ] && job transformers-cuda --backend=transformers --device=cuda
[ -n "${VERIFY-1}" ] && script torch-verify python3 tests/gpu/verify_torch_cuda.py --budget "$LIMIT" \
    --out "$RUNS/torch-verify.json"
[ -n "${VERIFY-1}" ] && script jax-verify python3 tests/gpu/verify_jax_cuda.py "$RUNS/jax-verify.json"
for f in TORCH-CUDNN-BROADCAST-BIAS TORCH-CUDA-FLASH-ZERO-SCALE TORCH-FLEX-COMPILE-NUMPY-SCALE; do
  [ -n "${FINDINGS-1}" ] && script "finding-$f" python3 "reports/findings/$f.py"
done
wait

for f in "$RUNS"/*.log; do
  echo "== $(basename "$f")"
  grep -E "verdict|^backend |worst error|passed|failed|error" "$f" | tail -6
done
tar czf "$OUT/gpu-runs.tar.gz" -C "$OUT" runs
ls -la "$OUT/gpu-runs.tar.gz"
sort "$RUNS/jobs.txt"
