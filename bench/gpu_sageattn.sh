#!/usr/bin/env bash
# Certify SageAttention's `sageattn` in the sageattn convention on a CUDA machine, one command:
#
#   bash bench/gpu_sageattn.sh            # OUT=/tmp/attnconf-sage VERSION=1.0.6 LIMIT=420
#
# Installs sageattention (pure Triton for 1.0.x) into a private target folder, never into the
# environment, then runs the suite twice: to the end (--run-timeout=$LIMIT, the full picture) and
# with -x (the first failure, seconds). Run files, logs and failing cases land in $OUT.
# On a machine without CUDA set CPU=1: the Triton interpreter runs the kernels (TRITON_INTERPRET=1) and
# python -O drops sageattn's `assert q.is_cuda` (minutes per test; only the -x run is made).
set -u
OUT=${OUT:-/tmp/attnconf-sage}
VERSION=${VERSION:-1.0.6}
LIMIT=${LIMIT:-420}
PY=${PYTHON:-python3}
SITE="$OUT/site"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
bash bench/install_checkout.sh "$PY" || exit 2
if [ ! -d "$SITE/sageattention" ]; then
  $PY -m pip install --quiet --target "$SITE" --no-deps "sageattention==$VERSION" \
    || { echo "cannot install sageattention==$VERSION"; exit 2; }
fi
$PY -c "import triton" 2>/dev/null || $PY -m pip install --quiet --target "$SITE" triton
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
DEVICE=cuda; FLAGS=""
if [ "${CPU:-0}" = 1 ]; then export TRITON_INTERPRET=1; DEVICE=cpu; FLAGS="-O"; fi
ARGS=(conformance --backend=torch --device=$DEVICE --kernel=sageattention:sageattn --convention=sageattn
      --capabilities=reports/sageattention/capabilities.toml --hypothesis-profile=ci -q -p no:cacheprovider)
$PY $FLAGS -m pytest "${ARGS[@]}" -x --report="$OUT/sageattn-$VERSION-$DEVICE-first.json" \
    --failures-dir="$OUT/failures-first" > "$OUT/first.log" 2>&1
echo "first failure run: exit $?"; tail -5 "$OUT/first.log"
if [ "$DEVICE" = cuda ]; then
  timeout $((LIMIT + 120)) $PY -m pytest "${ARGS[@]}" --run-timeout="$LIMIT" \
      --report="$OUT/sageattn-$VERSION-$DEVICE.json" --failures-dir="$OUT/failures" > "$OUT/full.log" 2>&1
  echo "full run: exit $?"; tail -5 "$OUT/full.log"
fi
