#!/usr/bin/env bash
# One call on the GPU machine: the CUDA/Triton tests, first-call cost, benches.
# Usage (device tool): bash tools/gpu_check.sh [tests|cold|select|step|iteration|prune|...]...
# Parts run in the order given, each bounded by its own timeout and all of them by
# GPU_BUDGET_S (default 560 s, under the device tool's 600 s per call): a part starts
# only with at least 30 s left and gets at most what is left, so the call ends by
# itself with every log written. Logs go to $OUT (or ./gpu-out), one file per part
# (seven at most: the device tool brings back eight files).
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
BUDGET_S=${GPU_BUDGET_S:-560}
END=$((SECONDS + BUDGET_S))
[ $# -eq 0 ] && set -- tests cold select step iteration
TESTS="tests/gpu tests/pruning/test_cuda.py tests/test_topk_triton.py tests/test_sparsify_triton.py
       tests/select/test_triton_keys.py"

# limit S: S seconds, or what the budget has left if less (timeout 0 would mean none)
limit() { local left=$((END - SECONDS - 5)); left=$(( left < 1 ? 1 : left )); echo $(( $1 < left ? $1 : left )); }

for part in "$@"; do
  left=$((END - SECONDS))
  if [ "$left" -lt 30 ]; then echo "=== $part skipped: ${left} s of the budget left"; continue; fi
  echo "=== $part $(date +%T) (${left} s of the budget left)"
  case $part in
    tests) timeout "$(limit 400)" python3 -m pytest -q --maxfail=20 -p no:cacheprovider $TESTS \
             2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    quicktests) timeout "$(limit 300)" python3 -m pytest -q --maxfail=20 -p no:cacheprovider \
             $TESTS -k "not property" 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    cold) for dt in float32 bfloat16 float16; do
            TRITON_CACHE_DIR=$(mktemp -d) timeout "$(limit 120)" python3 -c "
import time, torch, gradsift
x = torch.randn(10_000_000, device='cuda').to(torch.$dt); torch.cuda.synchronize()
t = time.perf_counter(); gradsift.topk_indices(x, 10_000); torch.cuda.synchronize()
t1 = time.perf_counter(); gradsift.topk_indices(x, 100_000); torch.cuda.synchronize()
print(f'cold first call $dt: {t1 - t:.2f} s; first call at k=1%: {time.perf_counter() - t1:.2f} s')
" 2>&1 | tee -a "$OUT/cold.log"; done ;;
    select) timeout "$(limit 300)" python3 -m gradsift bench select --device cuda 2>&1 \
             | tee "$OUT/select.log" ;;
    step) timeout "$(limit 300)" python3 -m gradsift bench step --device cuda 2>&1 \
             | tee "$OUT/step.log" ;;
    iteration) timeout "$(limit 300)" python3 -m gradsift bench iteration --device cuda \
             --repeats 15 2>&1 | tee "$OUT/iteration.log" ;;
    prune) { timeout "$(limit 300)" python3 -m pytest -q -x -p no:cacheprovider \
               tests/pruning/test_cuda.py 2>&1 | tail -25
             timeout "$(limit 300)" python3 -m gradsift bench prune-memory --device cuda 2>&1
             timeout "$(limit 400)" python3 -m gradsift bench prune-memory --network gpt2 \
               --device cuda 2>&1; } | tee "$OUT/prune.log" ;;
    *) timeout "$(limit 300)" bash -c "$part" 2>&1 | tee -a "$OUT/extra.log" ;;
  esac
done
echo "=== done $(date +%T)"
