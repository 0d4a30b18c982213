#!/usr/bin/env bash
# The 2026 checks on a lent GPU, one call: SageAttention 1.0.6 (pure Triton) in the sageattn convention on
# CUDA, first failure (-x) and, on a copy of k (its smooth-K mutates the caller's k), a time-bounded full run;
# and ATTN-DET-1 (bitwise reruns) on torch's CUDA SDPA paths. The machine has no network: the sageattention
# wheel travels in .whl/ (pip download --no-deps sageattention==1.0.6). Everything lands in $OUT/gpu2026.tar.gz.
#
#   OUT=/tmp/gpu LIMIT=240 bash bench/gpu_2026.sh
set -u
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/attnconf-gpu2026}
LIMIT=${LIMIT:-240}
RUNS="$OUT/gpu2026"
mkdir -p "$RUNS"
bash bench/install_checkout.sh python3 || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sage-site .whl/sageattention-*.whl \
  || echo "sageattention wheel not installed" | tee -a "$RUNS/jobs.txt"
{
  python3 -c "import sys, torch, triton, hypothesis, pytest; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'hypothesis', hypothesis.__version__)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} > "$RUNS/environment.txt" 2>&1
job() {  # name args...: one pytest process in the background
  local name=$1; shift
  (
    t0=$(date +%s)
    PYTHONPATH=/tmp/sage-site timeout $((LIMIT + 90)) python3 -m pytest conformance "$@" --hypothesis-profile=ci -q \
        -p no:cacheprovider --report="$RUNS/$name.json" --failures-dir="$RUNS/failures-$name" > "$RUNS/$name.log" 2>&1
    echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a "$RUNS/jobs.txt"
  ) &
}
SAGE=(--backend=torch --device=cuda --convention=sageattn --capabilities=reports/sageattention/capabilities.toml)
job sageattn-cuda-first "${SAGE[@]}" --kernel=sageattention:sageattn -x
job sageattn-k-copied-cuda "${SAGE[@]}" --kernel=reports.sageattention.sageattn_k_copied:sageattn --run-timeout="$LIMIT"
job determinism-torch-cuda --backend=torch --device=cuda \
    --impl=torch:sdpa-math,torch:sdpa-flash,torch:sdpa-efficient,torch:sdpa-cudnn -k determinism --run-timeout="$LIMIT"
wait
tar -czf "$OUT/gpu2026.tar.gz" -C "$OUT" gpu2026
cat "$RUNS/jobs.txt" "$RUNS/environment.txt"; for f in "$RUNS"/*.log; do echo "== $f"; tail -n 25 "$f"; done
