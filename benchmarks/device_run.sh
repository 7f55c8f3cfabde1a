#!/usr/bin/env bash
# What we run on the lent GPU, in stages that fit one call each (10 minutes):
#   bash benchmarks/device_run.sh tests [PYTEST ARGS]   pytest -m gpu (+ persistent-kernel smoke runs first)
#   bash benchmarks/device_run.sh tests-sharded N [PYTEST ARGS]   pytest -m gpu in N processes at once (each a share of the
#                                            collected tests): the whole suite in one call, where one process takes two
#   bash benchmarks/device_run.sh ids FILE [SECONDS]   pytest -m gpu on the node ids in FILE, one per line (e.g. a run's
#                                            failures, after their fix)
#   bash benchmarks/device_run.sh ring      persistent_mma's cp.async ring of streamed chunks (A, and with ring_h B): GPU tests,
#                                            compute-sanitizer, then blog-a's streaming default against the points in POINTS
#                                            (kernel_variants; e.g. ring_h=1 beside today's ring=2)
#   bash benchmarks/device_run.sh wgmma [SHAPE ...]   projection_wgmma's GPU tests, then its points (fp16, TF32, 3xTF32)
#                                            against projection_staged's default and cuBLAS (benchmarks/projection_staged.py)
#   IDS="tma=[12]" bash benchmarks/device_run.sh wgmma-fp16 [SHAPE ...]   the fp16 wgmma points against the default
#                                            and cuBLAS (projection_staged.py), then the GPU tests whose ids match IDS (grep -E)
#   bash benchmarks/device_run.sh wgmma-stores   the epilogue's columns per store (1, 2: compile's default, 4) in fp16,
#                                            TF32 and 3xTF32 GEMMs, then bench blog-a and b64-h1024-l2
#   bash benchmarks/device_run.sh wgmma-ds2   fp16 wgmma 128 x 128 storing pairs (two blocks an SM where the ring allows)
#                                            against projection_staged (compile's pick where 256 columns do not divide the
#                                            gates: ds2-lstm's 3200) and against the 256-column default (blog-a, b64-h1024)
#   bash benchmarks/device_run.sh half-xw [ROW ...]   half layers' XW in their dtype: the GPU tests of the GEMMs writing it,
#                                            then whole fp16 models with it against fp32 XW (benchmarks/half_xw_ab.py)
#   bash benchmarks/device_run.sh half-xw-stores   with XW in fp16: the fp16 GEMMs storing 2 and 4 columns (two 4-byte
#                                            pairs leave half sectors), then blog-a whole with the 256-column point's st4
#   bash benchmarks/device_run.sh narrow-gates   3xTF32 over 160 / 96 columns (ds2-gru): GPU tests, GEMM, whole models
#   bash benchmarks/device_run.sh halves [gemm SHAPE ...|ab ROW ...]   exact fp32 as fp16 products of scaled halves (f16x3): GPU
#                                            tests and the GEMM alone, or whole models against 3xTF32
#   bash benchmarks/device_run.sh step-halves [ROW ...]   exact-fp32 steps as f16x3 (schedules.step_halves): their GPU tests and
#                                            persistent_mma's, then whole models against 3xTF32 steps (benchmarks/step_halves_ab.py)
#   bash benchmarks/device_run.sh step-halves-streamed [ROW ...]   f16x3 steps with chunks of R streamed through the ring:
#                                            GPU tests, racecheck, then blog-a against 3xTF32 steps (SET=streamed step_halves_ab.py)
#   [SET=order|sums] bash benchmarks/device_run.sh stream-order   streamed chunks of R in the ring's order (streamed_r), or the
#                                            partial sums in the ring (SUMS_IN_RING): GPU tests, sanitizers, blog-a A/B
#   bash benchmarks/device_run.sh probe-cluster   clusters + cooperative launch + DSMEM load + cluster barrier cost
#   bash benchmarks/device_run.sh sanitize-halves   the f16x3 steps (persistent_mma, exact fp32, initial_h) under compute-sanitizer
#   bash benchmarks/device_run.sh sanitize-gemm   compile's wgmma GEMMs under compute-sanitizer memcheck and racecheck
#   bash benchmarks/device_run.sh split-regs [gemm|ab ROW ...]   3xTF32 with X split in registers: GPU tests, GEMM, whole models
#   bash benchmarks/device_run.sh store-cols-ab [ROW ...]   fp16 models with the 256-column GEMM storing 2 / 4 columns
#   bash benchmarks/device_run.sh wgmma-fp32 [ROW ...]   fp32 layers' warpgroup GEMM (3xTF32, TF32): GPU tests, then whole
#                                            models with it against projection_staged (benchmarks/projection_in_model.py)
#   bash benchmarks/device_run.sh blog-a-ring   blog-a's streamed points (20 units per block, no prefetch, more bytes in flight) against
#                                            auto; first `tests-sharded 4 tests/test_kernels.py -k "ring or units_not"` (their GPU tests)
#   bash benchmarks/device_run.sh blog-a-warps   streaming's default (20 units) GPU tests, then its points with 16 warps or
#                                            fewer streamed chunks (spill-free on ptxas) against it, then bench blog-a
#   bash benchmarks/device_run.sh ncu [ROW DTYPE T]   Nsight Compute sections of one row's recurrent kernel (benchmarks/ncu_row.py)
#   bash benchmarks/device_run.sh bench    the benchmark table against cuDNN
#   bash benchmarks/device_run.sh sanitize [KERNEL]   compute-sanitizer racecheck/synccheck/memcheck on one small layer
#   bash benchmarks/device_run.sh tune     MetaSchedule over the benchmark rows and the zoo (logs to $OUT/tuning_logs)
#   bash benchmarks/device_run.sh tune-rows ROW,ROW   tune those rows into the checkout's tuning_logs (appending to the
#                                            committed records) and bring the logs back; time them in a second call with
#                                            `bench --kernel auto --kernel tuned --row ROW ...` once the logs are committed
#   bash benchmarks/device_run.sh variants KIND [ROW ...]   points of one kernel kind (tiled | mma | persistent_mma) against the defaults
#   bash benchmarks/device_run.sh projection [SHAPE ...]   the staged tensor-core projection against today's GEMMs and cuBLAS
#   bash benchmarks/device_run.sh profile [ROW ...]   each row's kernels (count, GPU time) against its wall time: the idle gaps
#   bash benchmarks/device_run.sh fp32-error [ROW ...]   exact fp32 against float64 per projection GEMM and kernel kind
#   bash benchmarks/device_run.sh in-model [ROW ...]   whole models with the staged projection and the GEMMs it replaced swapped in
#   bash benchmarks/device_run.sh validate   one call for what CI built but no GPU ran yet (session 9's exact-fp32 changes):
#                                            fp32 against float64 at lat-b1-h1024's size, the kernel tests of the kinds whose
#                                            epilogue or 3xTF32 accumulation changed, and where fp32's error comes from
#   bash benchmarks/device_run.sh graph [ROW...]  whole runs as CUDA graphs: the GPU test, then graph vs no graph per row
#   bash benchmarks/device_run.sh projection-split [ROW...]  the projection's run-time tiles and split K: GPU tests, then A/B
#   bash benchmarks/device_run.sh wavefront [ROW...]  stacked layers as one kernel: GPU tests, compute-sanitizer, then the
#                                            bench of the rows (default lat-b1-h512-l2) with the wavefront (auto, tuned)
#                                            beside the layers one by one (persistent)
#   bash benchmarks/device_run.sh wavefront-variants [ROW...]  the wavefront's knobs A/B, then pytest -m gpu but test_kernels.py / test_projections.py
#   bash benchmarks/device_run.sh wavefront-gru   stacked GRUs and PyTorch's export as one kernel: GPU tests, then a GRU A/B
#   bash benchmarks/device_run.sh resident-tiles [ROW...]  persistent_mma's batch tiles at batch 8-20, exact fp32, A/B
#   TUNE_S=400 BUDGET=5.5 bash benchmarks/device_run.sh tune-zoo   the models/ zoo into tuning_logs/cuda-sm_90 (after a few GPU tests)
# Results go to $OUT (the device tool brings them back); commit the ones that matter under benchmarks/results/.
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

run_ids() {  # run_ids FILE SECONDS LOG [-v]: pytest -m gpu on the node ids in FILE (one per line: ids hold spaces), log to LOG
  timeout "$2" python3 -c 'import sys, pytest; sys.exit(pytest.main(["-m", "gpu", sys.argv[2], "-rfE", "-p", "no:cacheprovider"] + open(sys.argv[1]).read().splitlines()))' \
    "$1" "${4:--q}" 2>&1 | grep -v "Warning: Scope" | tee "$3"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
set -- "${1:-tests}" "${@:2}"
[ "$1" = tests ] && [ $# -eq 1 ] && set -- tests tests/
case "$1" in
  tests)
    for k in "persistent LSTM" "persistent_mma LSTM" "persistent_mma GRU"; do
      timeout 120 python3 benchmarks/sanitize_case.py $k 2>&1 | grep -v Warning | tee -a "$OUT/smoke.txt"
    done
    # PYTEST ARGS replace tests/ (all of pytest -m gpu may not fit one process: tests-sharded runs it in one call)
    timeout 540 python3 -m pytest -m gpu -q -rA -p no:cacheprovider "${@:2}" 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -60 ;;
  tests-sharded)
    set -- "${@:2}"; shards=$1; shift; [ $# -eq 0 ] && set -- tests/
    python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep "^tests/.*::" > /tmp/gpu_ids.txt
    rm -f /tmp/gpu_shard.*; split -n "r/$shards" -d /tmp/gpu_ids.txt /tmp/gpu_shard.
    wc -l /tmp/gpu_ids.txt
    for f in /tmp/gpu_shard.*; do  # 4 shards take the whole suite in ~430 s; 6 contend for the 16 cores and take longer
      run_ids "$f" "${TESTS_S:-540}" "$OUT/pytest_gpu_${f##*.}.txt" -v > /dev/null &
    done
    wait
    tail -qn 1 "$OUT"/pytest_gpu_*.txt; echo "PASSED: $(cat "$OUT"/pytest_gpu_*.txt | grep -c ' PASSED')"; grep -h "FAILED\|ERROR" "$OUT"/pytest_gpu_*.txt ;;
  ids)
    run_ids "$2" "${3:-300}" "$OUT/pytest_gpu_ids.txt" -v | tail -3 ;;
  ring)
    timeout 200 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_kernels.py -k "ring or streamed" 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -4
    for mode in ring ring-h; do
      for tool in racecheck synccheck memcheck; do
        timeout 100 compute-sanitizer --tool $tool python3 benchmarks/sanitize_case.py persistent_mma LSTM $mode 2>&1 | grep -v Warning | tail -4 | tee "$OUT/sanitizer_${mode}_$tool.txt"
      done
    done
    BASELINES=auto timeout 300 python3 benchmarks/kernel_variants.py persistent_mma blog-a 2>&1 | grep -v Warning | tee "$OUT/variants_log.txt" | tail -12 ;;
  wgmma)
    # the warpgroup projection: its GPU tests (every mode, the whole-model ones), then its points beside the staged GEMM's
    # default and cuBLAS in fp16 and fp32 (TF32, 3xTF32)
    timeout 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_projections.py -k wgmma 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -8
    STAGED=default timeout 320 python3 benchmarks/projection_staged.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/projection_log.txt" | tail -40 ;;
  wgmma-fp16)  # the timing first (the point of the call), then the new points' GPU tests, picked by a string of their ids
    DTYPES=float16 STAGED=default timeout 170 python3 benchmarks/projection_staged.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/projection_log.txt" | tail -16
    python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider tests/test_projections.py 2>/dev/null | grep -E "${IDS:-warpgroups=4}" > /tmp/ids.txt
    run_ids /tmp/ids.txt 100 "$OUT/pytest_gpu.txt" | tail -4 ;;
  wgmma-stores)
    WGMMA='s4 k64 overlap( st2| st4)?$' STAGED=none DTYPES=float16 timeout 100 python3 benchmarks/projection_staged.py blog-a b64-h1024 2>&1 \
      | grep -v Warning | tee "$OUT/projection_log.txt" | cut -c1-150
    WGMMA='(tf32 128x(256 s4|128 s6) overlap|tf32x3 128x128 s2)( st2| st4)?$' STAGED=none DTYPES=float32 timeout 150 python3 benchmarks/projection_staged.py blog-a "ds2-5l-bi l1+" 2>&1 \
      | grep -v Warning | tee "$OUT/projection_fp32_log.txt" | cut -c1-150
    timeout 200 python3 -m tvmrnn.cli bench --repeats 20 --out "$OUT" --row blog-a --row b64-h1024-l2 --kernel auto --kernel tf32 2>&1 \
      | grep -v Warning | tee "$OUT/bench_log.txt" | tail -14 ;;
  wgmma-ds2)
    WGMMA='128x128 .*st2$|128x256 s4 k64 overlap st2$' STAGED=default DTYPES=float16 timeout 200 python3 benchmarks/projection_staged.py ds2-lstm blog-a b64-h1024 2>&1 \
      | grep -v Warning | tee "$OUT/projection_log.txt" | cut -c1-150 ;;
  half-xw)
    timeout 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_projections.py -k "half_xw or model_with_wgmma" 2>&1 \
      | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -4
    timeout 340 python3 benchmarks/half_xw_ab.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/half_xw_log.txt" | tail -8 ;;
  half-xw-stores)
    XW=float16 WGMMA='(128x256 s4 k64|128x128 s4 k32) overlap st[24]$' STAGED=default DTYPES=float16 timeout 200 python3 benchmarks/projection_staged.py \
      blog-a b64-h1024 ds2-lstm 2>&1 | grep -v Warning | tee "$OUT/projection_log.txt" | cut -c1-150
    POINTS='wgmma 128x256 s4 k64 overlap st4' DTYPES=float16 timeout 300 python3 benchmarks/projection_in_model.py blog-a b64-h1024-l2 2>&1 \
      | grep -v Warning | tee "$OUT/in_model_log.txt" | tail -6 ;;
  sanitize-gemm)  # compile's wgmma GEMMs (3xTF32 128 x 128 and 64 x 128, fp16 128 x 256, f16x3 64 x 128 and 64 x 160 with
    # X's split kernel) under memcheck and racecheck
    for tool in memcheck racecheck; do
      timeout 250 compute-sanitizer --tool $tool python3 benchmarks/sanitize_gemm.py 2>&1 | grep -v Warning | tee "$OUT/sanitize_gemm_$tool.txt" | tail -5
    done ;;
  split-regs)  # 3xTF32 with X split in registers (lo_w): its GPU tests, the GEMM alone beside the split in shared memory
    # and cuBLAS (fp32 shapes), then whole exact-fp32 models with each (benchmarks/split_regs_ab.py)
    timeout 150 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_projections.py -k "wgmma and tf32x3" 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -4
    DTYPES=float32 STAGED=none WGMMA="tf32x3" timeout 200 python3 benchmarks/projection_staged.py blog-a b64-h1024 ds2-lstm "ds2-5l-bi l1+" 2>&1 | grep -v Warning > "$OUT/gemm_log.txt"
    python3 -c "import json; [print(r['shape'], r['kernel'], r['ms'] and round(r['ms'], 3), r['rel_err']) for r in json.load(open('$OUT/projection_staged.json'))['results']]"
    [ "${2:-}" = gemm ] || timeout 380 python3 benchmarks/split_regs_ab.py "${@:3}" 2>&1 | grep -v Warning | tee "$OUT/split_regs_log.txt" | tail -8 ;;
  step-halves)  # f16x3 steps: their GPU tests and persistent_mma's knobs, then whole models against 3xTF32 steps
    python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider tests/test_step_halves.py tests/test_kernels.py tests/test_gpu.py \
      -k "step_halves or persistent_mma_knobs or exact_fp32 or repeated_runs or cuda_matches or (sampled_points and persistent_mma) or writes_every_element" \
      2>/dev/null | grep "::" > /tmp/ids.txt
    for i in 0 1 2; do awk "NR % 3 == $i" /tmp/ids.txt > /tmp/ids$i.txt; run_ids /tmp/ids$i.txt 280 "$OUT/pytest_gpu_$i.txt" > /dev/null & done
    wait; tail -n 3 "$OUT"/pytest_gpu_*.txt
    timeout 280 python3 benchmarks/step_halves_ab.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/step_halves_log.txt" | tail -14 ;;
  step-halves-streamed)  # f16x3 with streamed chunks (blog-a): GPU tests, compute-sanitizer, then blog-a against 3xTF32 steps
    timeout 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_step_halves.py tests/test_kernels.py -k "streamed or ring" 2>&1 \
      | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -4
    timeout 120 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_case.py persistent_mma LSTM ring-h-halves 2>&1 | grep -v Warning | tail -4 \
      | tee "$OUT/sanitizer_streamed_halves.txt"
    SET=streamed timeout 240 python3 benchmarks/step_halves_ab.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/step_halves_log.txt" | tail -4 ;;
  stream-order)  # streamed chunks of R copied once per launch in the ring's order (schedules/streamed_r.py): GPU tests, compute-sanitizer
    # (racecheck on f16x3 and a GRU's two phases, memcheck on the copy's offsets), then blog-a against R's row order
    timeout 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_step_halves.py tests/test_kernels.py -k "streamed or ring" 2>&1 \
      | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -4
    for c in "racecheck LSTM ring-h-halves" "racecheck GRU ring-h" "memcheck GRU ring-h" "memcheck LSTM ring-h-halves" "synccheck LSTM ring-h" \
             "racecheck LSTM ring"; do set -- $c
      echo "== $1 $2 $3"; timeout 120 compute-sanitizer --tool $1 python3 benchmarks/sanitize_case.py persistent_mma $2 $3 2>&1 | grep -v Warning | tail -3
    done | tee "$OUT/sanitizer_stream_order.txt"
    timeout 300 python3 benchmarks/stream_order_ab.py 2>&1 | grep -v Warning | tee "$OUT/stream_${SET:-order}_log.txt" | tail -4 ;;
  probe-cluster)  # thread-block clusters in a cooperative launch: a DSMEM load of the partner block's shared memory, the grid
    # barrier with clusters, a cluster barrier's cost (benchmarks/probe_cluster.py)
    timeout 120 python3 benchmarks/probe_cluster.py 2>&1 | grep -v Warning | tee "$OUT/probe_cluster.txt" | tail -5 ;;
  halves)  # exact fp32 as three fp16 products of scaled halves (f16x3): its GPU tests and the GEMM alone beside compile's
    # 3xTF32 points and cuBLAS (gemm), or whole exact-fp32 models against 3xTF32 (ab [ROW ...]: benchmarks/halves_ab.py)
    if [ "${2:-gemm}" = gemm ]; then
      timeout 220 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_projections.py tests/test_gpu.py -k "halves or model_with_wgmma or cuda_matches" 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -4
      DTYPES=float32 STAGED=none WGMMA="f16x3|tf32x3 (128x128 s2 k64|64x128 s2|64x160 s2) st2 regs$" timeout 330 python3 benchmarks/projection_staged.py "${@:3}" 2>&1 | grep -v Warning > "$OUT/gemm_log.txt"
      python3 -c "import json; [print(r['shape'], r['kernel'], r['ms'] and round(r['ms'], 3), r['rel_err']) for r in json.load(open('$OUT/projection_staged.json'))['results']]"
    else
      timeout 560 python3 benchmarks/halves_ab.py "${@:3}" 2>&1 | grep -v Warning | tee "$OUT/halves_log.txt" | tail -12
    fi ;;
  narrow-gates)  # 3xTF32 where 128 columns do not divide the gates (ds2-gru): GPU tests, the GEMM beside the staged one,
    # whole ds2-gru fp32 models (SET=widths benchmarks/split_regs_ab.py)
    timeout 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_projections.py tests/test_gpu.py -k "narrow or cuda_matches" 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -3
    DTYPES=float32 STAGED=default WGMMA="64x160|64x96" timeout 150 python3 benchmarks/projection_staged.py ds2-gru 2>&1 | grep -v Warning > "$OUT/gemm_log.txt"
    python3 -c "import json; [print(r['shape'], r['kernel'], r['ms'] and round(r['ms'], 3), r['rel_err']) for r in json.load(open('$OUT/projection_staged.json'))['results']]"
    SET=widths timeout 200 python3 benchmarks/split_regs_ab.py ds2-gru 2>&1 | grep -v Warning | tail -2 ;;
  store-cols-ab)  # the 256-column default's 2 against 4 columns a store in whole fp16 models, interleaved
    timeout 400 python3 benchmarks/store_cols_ab.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/store_cols_log.txt" | tail -4 ;;
  wgmma-fp32)  # fp32 layers on the warpgroup GEMM: its GPU tests (3xTF32 kernels, whole fp32 and TF32 models), then whole
    # models with it against the staged GEMM in the same mode (benchmarks/projection_in_model.py, DTYPES=float32)
    timeout 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_projections.py tests/test_fp32_accuracy.py tests/test_gpu.py \
      -k "(wgmma and tf32x3) or model_with_wgmma or exact_fp32_long or tf32_precision" 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -8
    DTYPES=float32 timeout 380 python3 benchmarks/projection_in_model.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/in_model_log.txt" | tail -30 ;;
  blog-a-ring)  # blog-a's streamed points that build without spills (benchmarks/results/2026-11-25-ptxas-blog-a-ring-points.txt):
    # 20 units per block (128 blocks, not 107; fewer chunks streamed), without XW prefetched (exact fp32's default spills
    # 96 bytes with it), more bytes in flight (ring 3; k_warps 2 with ring 4)
    POINTS='[{"units":20,"n_tiles":4,"n_warps":2,"k_warps":4,"depth":1,"prefetch":1,"ring":2,"ring_h":1,"streamed":"fewest"},
             {"units":20,"n_tiles":4,"n_warps":2,"k_warps":4,"depth":1,"prefetch":0,"ring":2,"ring_h":1,"streamed":"fewest"},
             {"units":24,"n_tiles":4,"n_warps":2,"k_warps":4,"depth":1,"prefetch":0,"ring":2,"ring_h":1,"streamed":"fewest"},
             {"units":24,"n_tiles":4,"n_warps":2,"k_warps":4,"depth":1,"prefetch":1,"ring":3,"ring_h":1,"streamed":"fewest"},
             {"units":24,"n_tiles":4,"n_warps":2,"k_warps":2,"depth":1,"prefetch":1,"ring":4,"ring_h":1,"streamed":"fewest"}]' \
      DTYPES=${DTYPES:-float16,float32} BASELINES=auto timeout 560 python3 benchmarks/kernel_variants.py persistent_mma blog-a 2>&1 | grep -v Warning | tee "$OUT/variants_log.txt" | tail -14 ;;
  blog-a-warps)  # after streaming_config took 20 units without XW prefetched (2026-11-25-h100-blog-a-units20.md): more
    # warps per SM for the latency-bound step (n_warps 4 or 8, fewer tiles each), or fewer chunks streamed (k_warps 2)
    TESTS_S=120 bash "$0" tests-sharded 4 tests/test_kernels.py -k "stream or ring or units_not" | tail -3
    p='"units":20,"depth":1,"prefetch":0,"ring":2,"ring_h":1,"streamed":"fewest"'
    POINTS="[{$p,\"n_tiles\":2,\"n_warps\":4,\"k_warps\":4},{$p,\"n_tiles\":1,\"n_warps\":8,\"k_warps\":2},{$p,\"n_tiles\":2,\"n_warps\":4,\"k_warps\":2}]" \
      DTYPES=float16 BASELINES=auto timeout 150 python3 benchmarks/kernel_variants.py persistent_mma blog-a 2>&1 | grep -v Warning | tail -4
    mv "$OUT/persistent_mma_variants.json" "$OUT/persistent_mma_variants_fp16.json"
    POINTS="[{$p,\"n_tiles\":2,\"n_warps\":4,\"k_warps\":2},{$p,\"n_tiles\":2,\"n_warps\":4,\"k_warps\":4}]" \
      DTYPES=float32 BASELINES=auto timeout 150 python3 benchmarks/kernel_variants.py persistent_mma blog-a 2>&1 | grep -v Warning | tail -3
    timeout 200 python3 -m tvmrnn.cli bench --repeats 20 --out "$OUT" --row blog-a --kernel auto --kernel tf32 2>&1 | grep -v Warning | tee "$OUT/bench_log.txt" | tail -12 ;;
  ncu)  # Nsight Compute on one row's recurrent kernel (ROW DTYPE [T], default blog-a float16 20): where a step's time goes
    timeout 300 ncu -k regex:rnn_ --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section Occupancy \
      --metrics "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,lts__t_sector_hit_rate.pct,l1tex__m_xbar2l1tex_read_bytes.sum.per_second" \
      python3 benchmarks/ncu_row.py "${2:-blog-a}" "${3:-float16}" "${4:-20}" 2>&1 \
      | grep -v Warning | tee "$OUT/ncu_${2:-blog-a}_${3:-float16}.txt" | tail -60 ;;
  bench)
    timeout 560 python3 -m tvmrnn.cli bench --repeats 20 --out "$OUT" "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/bench_log.txt" | tail -40 ;;
  tune)
    timeout 570 python3 benchmarks/tune_suite.py --trials "${TRIALS:-400}" --time-budget "${BUDGET:-7}" --logs "$OUT/tuning_logs" 2>&1 \
      | grep -v Warning | tee "$OUT/tune_log.txt" | tail -70 ;;
  tune-rows)
    rows=${2:?comma-separated rows}
    timeout "${TUNE_S:-540}" python3 benchmarks/tune_suite.py --rows "$rows" --dtypes "${DTYPES:-float32,float16}" --no-zoo --trials "${TRIALS:-300}" --time-budget "${BUDGET:-8}" \
      --logs tuning_logs 2>&1 | grep -v Warning | tee "$OUT/tune_log.txt" | tail -30
    mkdir -p "$OUT/tuning_logs" && cp tuning_logs/cuda-sm_90/* "$OUT/tuning_logs/" ;;
  tune-zoo)  # the GPU tests of the projection's run-time tiles first, then the models/ zoo at batch buckets 1 and 8
    timeout 120 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_projections.py -k "tiles_by_rows" 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -3
    timeout "${TUNE_S:-400}" python3 benchmarks/tune_suite.py --no-rows --trials "${TRIALS:-600}" --time-budget "${BUDGET:-5.5}" \
      --logs tuning_logs 2>&1 | grep -v Warning | tee "$OUT/tune_log.txt" | grep -v "it/s\|trial/s" | tail -40
    mkdir -p "$OUT/tuning_logs" && cp tuning_logs/cuda-sm_90/* "$OUT/tuning_logs/" ;;
  variants)
    timeout 560 python3 benchmarks/kernel_variants.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/variants_log.txt" | tail -40 ;;
  validate)
    timeout 330 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_fp32_accuracy.py tests/test_kernels.py tests/test_projections.py \
      -k "fp32_accuracy or long_sequence or exact_fp32 or persistent_mma or sampled_points or knobs" 2>&1 \
      | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -25
    timeout 220 python3 benchmarks/fp32_error.py lat-b1-h1024 b8-h1024-l2 2>&1 | grep -v Warning | tee "$OUT/fp32_error_log.txt" ;;
  graph)
    timeout 300 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_cuda_graph.py 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -8
    timeout 500 python3 benchmarks/cuda_graph_ab.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/cuda_graph_log.txt" ;;
  projection-split)
    timeout 400 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_kernels.py tests/test_projections.py -k "picks_its_tiles or chunk_acc" 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -4
    timeout 400 python3 benchmarks/projection_split_ab.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/projection_split_log.txt" ;;
  profile)
    timeout 560 python3 benchmarks/profile_rows.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/profile_log.txt" | grep -v "^    " ;;
  fp32-error)
    timeout 560 python3 benchmarks/fp32_error.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/fp32_error_log.txt" ;;
  in-model)
    timeout 560 python3 benchmarks/projection_in_model.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/in_model_log.txt" | tail -30 ;;
  projection)
    timeout 560 python3 benchmarks/projection_staged.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/projection_log.txt" | tail -40 ;;
  wavefront)
    timeout 300 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_wavefront.py tests/test_cuda_graph.py 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -6
    for tool in racecheck synccheck memcheck; do
      timeout 120 compute-sanitizer --tool $tool python3 benchmarks/sanitize_case.py wavefront 2>&1 | grep -v Warning | tail -4 | tee "$OUT/sanitizer_wavefront_$tool.txt"
    done
    rows=("${@:2}"); [ ${#rows[@]} -eq 0 ] && rows=(lat-b1-h512-l2)
    timeout 300 python3 -m tvmrnn.cli bench --repeats 20 --out "$OUT" --kernel auto --kernel persistent --kernel tuned \
      $(printf -- "--row %s " "${rows[@]}") 2>&1 | grep -v Warning | tee "$OUT/bench_log.txt" | tail -12 ;;
  wavefront-variants)  # the variants first (short), then pytest -m gpu outside test_kernels.py and test_projections.py
    timeout 300 python3 benchmarks/wavefront_variants.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/wavefront_variants_log.txt"
    timeout 280 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests --deselect tests/test_kernels.py --deselect tests/test_projections.py 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -6 ;;
  wavefront-gru)  # the GPU tests of stacked GRUs and PyTorch's export, then GRU and LSTM stacks against layer by layer
    timeout 300 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_wavefront.py -k "gru or pytorch" 2>&1 | grep -v "Warning: Scope" | tee "$OUT/pytest_gpu.txt" | tail -4
    VARIANTS=layers,stage timeout 250 python3 benchmarks/wavefront_variants.py gru-b1-h512-l2 2>&1 | grep -v Warning | tee "$OUT/wavefront_variants_log.txt" ;;
  resident-tiles)
    timeout 560 python3 benchmarks/resident_tiles_ab.py "${@:2}" 2>&1 | grep -v Warning | tee "$OUT/resident_tiles_log.txt" ;;
  sanitize-halves)  # exact fp32's f16x3 steps (persistent_mma with initial_h: the grid-wide max |h0|, the halves' copies)
    for tool in racecheck synccheck memcheck; do
      timeout 100 compute-sanitizer --tool $tool python3 benchmarks/sanitize_case.py persistent_mma LSTM h0 2>&1 | grep -v Warning | tail -6 | tee "$OUT/sanitizer_halves_lstm_$tool.txt"
    done
    timeout 100 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_case.py persistent_mma GRU h0 2>&1 | grep -v Warning | tail -6 | tee "$OUT/sanitizer_halves_gru_racecheck.txt" ;;
  sanitize)
    for tool in racecheck synccheck memcheck; do
      timeout 180 compute-sanitizer --tool $tool python3 benchmarks/sanitize_case.py "${2:-persistent}" LSTM 2>&1 | grep -v Warning | tail -8 | tee "$OUT/sanitizer_${2:-persistent}_$tool.txt"
    done ;;
esac
