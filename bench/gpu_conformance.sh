#!/usr/bin/env bash
# The conformance suite on a lent GPU machine (torch CUDA fused paths, JAX cuDNN).
# Runs with that machine's own python3 (torch, jax, pytest, hypothesis preinstalled);
# writes run files and logs to $OUT. Budgets keep the whole call under 10 minutes.
set -u
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=4 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/attnconf-gpu}
mkdir -p "$OUT"
python3 -c "import torch, jax, hypothesis, pytest, ml_dtypes; print('torch', torch.__version__, 'jax', jax.__version__, 'hypothesis', hypothesis.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
suite() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" python3 -m pytest conformance "$@" --hypothesis-profile=ci -q -p no:cacheprovider \
      --report="$OUT/$name.json" --failures-dir="$OUT/failures-$name" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s"
}
# One process per torch implementation: a CUDA fault (cuDNN "misaligned address", seen on an H100)
# poisons the CUDA context of its process, and must not take the other implementations' results with it.
for impl in ${TORCH_IMPLS:-sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn flex mha}; do
  suite "torch-cuda-$impl" "${TORCH_S:-75}" --backend=torch --device=cuda --impl="torch:$impl"
done
[ -n "${TF32_S:-}" ] && suite torch-cuda-tf32 "$TF32_S" --backend=torch --device=cuda --allow-tf32 \
    --impl=torch:sdpa-math,torch:sdpa-efficient -k agreement
suite jax-gpu "${JAX_S:-170}" --backend=jax --device=gpu
for f in "$OUT"/*.log; do echo "== $f"; grep -E "verdict|worst error|FAIL |ERROR |passed|failed" "$f" | tail -14; done
