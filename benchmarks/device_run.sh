#!/usr/bin/env bash
# The GPU runs, one verb a call; each fits in 10 minutes. Run from the checkout's root; results go to $OUT (/tmp/out).
#   setup [WHEEL_DIR]               TVM importable (else installed from WHEEL_DIR's wheels, no package index needed);
#                                   prints TVM, PyTorch, the GPU and its driver
#   pytest-gpu [N] [K/P] [PYTEST ARGS]
#                                   pytest -m gpu on N xdist workers (default 4) taking the collected tests as they free
#                                   up (of part K of P, in collection order, where K/P is given); the whole suite takes
#                                   over 10 minutes on an H100, so two calls: 4 1/2, then 4 2/2 (TESTS_S caps each call)
#   bench [BENCH ARGS]              tvmrnn bench against cuDNN (default: every row, fp32 and fp16, exact and TF32)
#   profile [ROW ...]               each row's kernels and the GPU's idle time between them (profile_rows.py)
#   ncu [ROW DTYPE T]               Nsight Compute on one row's recurrent kernel (ncu_row.py; default blog-a float16 20)
#   sanitize [KERNEL CELL [MODE]]   compute-sanitizer racecheck, synccheck, memcheck on one small layer (sanitize_case.py)
#   sanitize-gemm                   memcheck and racecheck on compile's wgmma GEMMs (sanitize_gemm.py)
#   cluster-bench [ROWS [DTYPES]]   the cluster kernel's µs per step beside persistent and cuDNN (cluster_bench.py)
#   gemm [SHAPE ...]                the projection GEMMs beside cuBLAS (gemm_bench.py)
#   tune [ROW,ROW]                  MetaSchedule over the rows (default every row and the zoo) into $OUT/tuning_logs
#   load-test [ARGS]                tvmrnn serve under load against direct calls (load_test.py; CPU)
#   kernel-hashes [FILE]            hashes of every row's generated recurrent kernels (kernel_hashes.py; no GPU needed)
#   (device_stage.sh stages TVM, the wheels and the zoo's ONNX files for a machine without a package index)
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# the zoo's ONNX files carried in parts (.tvmdev/zoo1, zoo2: device_stage.sh), gathered where the zoo looks for them
carried_zoo=/tmp/tvmrnn-carried-zoo
for part in .tvmdev/zoo*; do [ -d "$part" ] && mkdir -p $carried_zoo/onnx && cp "$part"/* $carried_zoo/onnx/; done
[ -d $carried_zoo/onnx ] && export TVMRNN_ZOO_CACHE=${TVMRNN_ZOO_CACHE:-$carried_zoo}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
quiet() { grep -v "Warning"; }  # TVM's scope warnings, one per kernel built

pytest_ids() {  # pytest_ids FILE WORKERS SECONDS LOG: pytest -m gpu on the node ids in FILE (one per line; ids hold
  # spaces), handed to xdist's workers one by one as each frees up (--dist load), so no worker idles while another has
  # a queue; a worker that crashes is replaced and its test reported
  timeout --kill-after=10 "$3" python3 -c 'import sys, pytest; sys.exit(pytest.main(["-m", "gpu", "-n", sys.argv[2], "--dist", "load", "-v", "-rfE", "-p", "no:cacheprovider"] + open(sys.argv[1]).read().splitlines()))' \
    "$1" "$2" 2>&1 | quiet > "$4"
}

pytest_gpu() {  # pytest_gpu [N] [K/P] [PYTEST ARGS]
  local workers=4 part=1/1; [[ ${1:-} =~ ^[0-9]+$ ]] && { workers=$1; shift; }
  [[ ${1:-} =~ ^[0-9]+/[0-9]+$ ]] && { part=$1; shift; }
  [ $# -eq 0 ] && set -- tests/
  local ids log="$OUT/pytest_gpu.txt"; ids=$(mktemp -d)
  python3 -m pytest -m gpu -n 0 --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep "^tests/.*::" > "$ids/collected"
  split -n "l/$part" "$ids/collected" > "$ids/all"  # part K of P: whole lines, the same on every call
  local total; total=$(wc -l < "$ids/all")
  echo "$total GPU tests on $workers workers"  # 4 on 16 cores; 6 contend for the cores and take longer
  pytest_ids "$ids/all" "$workers" "${TESTS_S:-540}" "$log"
  tail -n 1 "$log"
  local ended; ended=$(grep -oE "\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) tests/" "$log" | cut -d' ' -f2)  # a line a test
  echo "outcomes: $(grep . <<< "$ended" | sort | uniq -c | xargs); not finished: $((total - $(grep -c . <<< "$ended")))"
  grep -E "^(FAILED|ERROR) " "$log"
}

setup() {  # setup [WHEEL_DIR]
  if ! python3 -c "import tvm" 2>/dev/null && [ -n "${1:-}" ]; then
    python3 -m pip install -q --no-index --no-deps "$1"/*.whl
  fi
  python3 -c "import tvm, torch; print('tvm', tvm.__version__, '| torch', torch.__version__, '| cuda device:', tvm.cuda(0).exist)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
}

sanitize() {  # sanitize [KERNEL CELL [MODE]]
  local args=("${@:-persistent}"); [ ${#args[@]} -eq 1 ] && [ "${args[0]}" != wavefront ] && args+=(LSTM)
  for tool in racecheck synccheck memcheck; do
    echo "== $tool ${args[*]}"
    timeout 180 compute-sanitizer --tool $tool python3 benchmarks/sanitize_case.py "${args[@]}" 2>&1 | quiet | tail -6
  done | tee "$OUT/sanitizer.txt"
}

ncu_row() {  # ncu_row [ROW DTYPE T]: the sections and stall reasons that say where a step's time goes
  local stalls="" s
  for s in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle lg_throttle wait membar not_selected \
           selected dispatch_stall tex_throttle sleeping branch_resolving drain imc_miss no_instruction misc; do
    stalls+="smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio,"
  done
  timeout 300 ncu -k regex:rnn_ --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy \
    --metrics "${stalls}lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,lts__t_sector_hit_rate.pct,l1tex__m_xbar2l1tex_read_bytes.sum.per_second" \
    python3 benchmarks/ncu_row.py "${1:-blog-a}" "${2:-float16}" "${3:-20}" 2>&1 | quiet | tee "$OUT/ncu_${1:-blog-a}_${2:-float16}.txt" | tail -60
}

tune() {  # tune [ROW,ROW]: the given rows only (appended to the checkout's tuning_logs), else every row and the zoo
  local scope=(); [ -n "${1:-}" ] && scope=(--rows "$1" --no-zoo)
  timeout "${TUNE_S:-560}" python3 benchmarks/tune_suite.py "${scope[@]}" --trials "${TRIALS:-400}" --time-budget "${BUDGET:-8}" \
    --logs tuning_logs 2>&1 | quiet | tee "$OUT/tune_log.txt" | grep -v "it/s\|trial/s" | tail -40
  mkdir -p "$OUT/tuning_logs" && cp -r tuning_logs/. "$OUT/tuning_logs/"
}

verb=${1:-pytest-gpu}; shift || true
case "$verb" in
  setup) setup "$@" ;;
  pytest-gpu) pytest_gpu "$@" ;;
  bench)
    [ $# -eq 0 ] && set -- --kernel auto --kernel tf32
    timeout 560 python3 -m tvmrnn bench --repeats 20 --out "$OUT" "$@" 2>&1 | quiet | tee "$OUT/bench_log.txt" | tail -40 ;;
  profile) timeout 560 python3 benchmarks/profile_rows.py "$@" 2>&1 | quiet | tee "$OUT/profile_log.txt" | grep -v "^    " ;;
  ncu) ncu_row "$@" ;;
  sanitize) sanitize "$@" ;;
  cluster-bench) timeout 590 python3 benchmarks/cluster_bench.py "$@" 2>&1 | quiet | tee "$OUT/cluster_bench.txt" | grep -v "^  " ;;
  sanitize-gemm)
    for tool in memcheck racecheck; do
      timeout 250 compute-sanitizer --tool $tool python3 benchmarks/sanitize_gemm.py 2>&1 | quiet | tee "$OUT/sanitize_gemm_$tool.txt" | tail -5
    done ;;
  gemm) timeout 560 python3 benchmarks/gemm_bench.py "$@" 2>&1 | quiet | tee "$OUT/gemm_log.txt" | tail -40 ;;
  tune) tune "$@" ;;
  load-test) timeout 560 python3 benchmarks/load_test.py --out "$OUT" "$@" 2>&1 | tee "$OUT/load_test_log.txt" | tail -20 ;;
  kernel-hashes) timeout 560 python3 benchmarks/kernel_hashes.py "${1:-$OUT/kernel_hashes.json}" 2>&1 | quiet | tail -20 ;;
  *) sed -n '2,19p' "$0"; exit 2 ;;
esac
