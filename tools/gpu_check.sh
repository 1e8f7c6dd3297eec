#!/usr/bin/env bash
# One call on the GPU machine: probes, the CUDA/Triton tests, first-call cost, benches.
# Usage (device tool): bash tools/gpu_check.sh [tests|cold|select|step|iteration|prune|...]...
# Logs go to $OUT (or ./gpu-out). Each part is bounded by its own timeout.
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
[ $# -eq 0 ] && set -- tests cold select step iteration
for part in "$@"; do
  echo "=== $part $(date +%T)"
  case $part in
    tests) timeout 400 python3 -m pytest -q --maxfail=20 -p no:cacheprovider tests/gpu \
             tests/pruning/test_cuda.py tests/test_topk_triton.py tests/test_sparsify_triton.py \
             tests/select/test_triton_keys.py \
             2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    cold) for dt in float32 bfloat16 float16; do
            TRITON_CACHE_DIR=$(mktemp -d) timeout 120 python3 -c "
import time, torch, gradsift
x = torch.randn(10_000_000, device='cuda').to(torch.$dt); torch.cuda.synchronize()
t = time.perf_counter(); gradsift.topk_indices(x, 10_000); torch.cuda.synchronize()
t1 = time.perf_counter(); gradsift.topk_indices(x, 100_000); torch.cuda.synchronize()
print(f'cold first call $dt: {t1 - t:.2f} s; first call at k=1%: {time.perf_counter() - t1:.2f} s')
" 2>&1 | tee -a "$OUT/cold.log"; done ;;
    select) timeout 300 python3 -m gradsift bench select --device cuda 2>&1 | tee "$OUT/select.log" ;;
    step) timeout 300 python3 -m gradsift bench step --device cuda 2>&1 | tee "$OUT/step.log" ;;
    iteration) timeout 300 python3 -m gradsift bench iteration --device cuda --repeats 15 2>&1 \
             | tee "$OUT/iteration.log" ;;
    quicktests) timeout 300 python3 -m pytest -q --maxfail=20 -p no:cacheprovider tests/gpu \
             tests/pruning/test_cuda.py tests/test_topk_triton.py tests/test_sparsify_triton.py \
             tests/select/test_triton_keys.py \
             -k "not property" 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    prune) timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/pruning/test_cuda.py \
             2>&1 | tee "$OUT/prune-tests.log" | tail -25
           timeout 300 python3 -m gradsift bench prune-memory --device cuda 2>&1 \
             | tee "$OUT/prune-memory.log"
           timeout 400 python3 -m gradsift bench prune-memory --network gpt2 --device cuda 2>&1 \
             | tee "$OUT/prune-memory-gpt2.log" ;;
    *) timeout 300 bash -c "$part" 2>&1 | tee -a "$OUT/extra.log" ;;
  esac
done
echo "=== done $(date +%T)"
