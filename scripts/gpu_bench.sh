#!/usr/bin/env bash
# The GPU measuring run: build the engine with the fused kernels, bench it, check it, and keep the
# result files. Runs on any machine with a CUDA GPU and PyTorch (2.11+) installed.
#
#   scripts/gpu_bench.sh setup               pip install this checkout (no dependencies pulled: torch stays);
#                                            wheels in $WHEELS (default .whl/) are installed first (polygraphy)
#   scripts/gpu_bench.sh build RESULTS       export (no ONNX graph) + AOTInductor build with the fused kernels
#   scripts/gpu_bench.sh bench RESULTS       wan-trt bench of the engine (CUDA graphs and not) beside
#                                            torch.compile and eager; JSON + chart in RESULTS
#   scripts/gpu_bench.sh check RESULTS       wan-trt check of the engine (--blocks 4) as JSON in RESULTS (an earlier
#                                            result replaced only by a check that wrote one)
#   scripts/gpu_bench.sh ort-check RESULTS   the ONNX graph itself: export with the graph (out/<config>_<precision>_onnx),
#                                            then wan-trt check of it on ONNX Runtime's CUDA provider (--blocks 4)
#                                            as JSON in RESULTS (needs onnxruntime-gpu)
#   scripts/gpu_bench.sh block-end RESULTS   what the end of a block costs (its checks and cache commit), as CUDA
#                                            graphs and op by op (scripts/bench_block_end.py; needs `build` first)
#   scripts/gpu_bench.sh long RESULTS        one stream of LONG_BLOCKS (1500) blocks: memory, time and finiteness
#                                            over the whole stream (scripts/long_stream.py)
#   scripts/gpu_bench.sh decoder RESULTS     the video decoder: export (no ONNX graph) + AOTInductor build (with
#                                            its fused norms: --ops $DECODER_OPS, default plugins) of its
#                                            two graphs + wan-trt check of the engines (--blocks 3) as JSON
#                                            (DECODER_CHECK=0: no check)
#   scripts/gpu_bench.sh decoder-bench RESULTS  one wan-trt bench: the DiT engine (CUDA graphs), the decoder rows
#                                            (PyTorch fp16 decoder eager / compiled / compiled with cuDNN
#                                            benchmark, the engine with and without CUDA graphs) and DiT +
#                                            decoder end to end, the decoder engine's profile by op class; the
#                                            GPU's clocks and power sampled beside it (nvidia-smi, CSV in RESULTS;
#                                            needs `build` and `decoder` first)
#   scripts/gpu_bench.sh cpp RESULTS         the C++ runtime (wan_stream) beside the Python session on the DiT and
#                                            decoder engines: identical frames?, ms per block (scripts/cpp_stream.py;
#                                            needs `build` and `decoder` first); with REV set, REV's C++ runtime
#                                            too, ROUNDS (2) runs of each alternating (REV must read this
#                                            checkout's runtime files: version 6, with the engine's device)
#   scripts/gpu_bench.sh precisions RESULTS  one wan-trt bench of the PRECISION (bf16) engine beside the fp16 and fp8
#                                            engines (--also-engine; built here if missing), torch.compile and
#                                            eager, with the profile of each engine (needs `build` first)
#   scripts/gpu_bench.sh build-rev RESULTS   the same engine built from another commit REV of this repository (its
#                                            files from git, installed apart; out/<config>_<precision>_aoti_<rev>),
#                                            e.g. beside `build` (both at once: `... build R & ... build-rev R; wait`)
#   scripts/gpu_bench.sh ab RESULTS          the REV engine against this checkout's in one process: ms per block
#                                            (scripts/ab_engines.py; INTERLEAVE=N: one stream of N blocks each, a
#                                            block of each engine in turn, with paired differences) and each
#                                            engine's kernels of one block (scripts/block_kernels.py); needs
#                                            `build` and `build-rev`
#   scripts/gpu_bench.sh decoder-rev RESULTS the decoder engine pair built from REV's code (out/<config>_<precision>_
#                                            <decoder graph>_<rev>), e.g. beside `DECODER_CHECK=0 ... decoder`
#   scripts/gpu_bench.sh ab-decoder RESULTS  the REV decoder engine against this checkout's in one process, a block
#                                            of each in turn (scripts/ab_decoder_engines.py); needs `decoder` and
#                                            `decoder-rev`
#   scripts/gpu_bench.sh ab-runtime RESULTS  REV's runtime (the session: its Python code) against this checkout's on
#                                            this checkout's engine: runs of each in turn, alternating
#                                            (scripts/time_blocks.py), and one block's kernel timeline under each
#                                            (scripts/block_kernels.py; KERNELS=0 skips them); needs `build`
#   scripts/gpu_bench.sh ab-env RESULTS      this checkout's runtime on its engine with ENV_VAR (CUBLASLT_WORKSPACE_SIZE) set
#                                            to ENV_A (0: no cuBLASLt workspace, as the runtime sets it up) and ENV_B
#                                            (1024 KiB: the default PyTorch's CUDA source gives it where the variable
#                                            is unset) in turn, ROUNDS rounds (scripts/time_blocks.py), then one block's
#                                            kernels under each (scripts/block_kernels.py; KERNELS=0 skips them)
#   scripts/gpu_bench.sh site                REV installed apart as build-rev, ab-runtime and ab take it
#                                            (out/site_<rev>), where git has REV: on a machine whose clone lacks
#                                            the commit, copy that folder there and pass REV=<rev> as printed
#   scripts/gpu_bench.sh all RESULTS         build, bench, check in turn
#
# CONFIG (default universal), PRECISION (bf16), BLOCKS (bench, 6), BACKENDS (bench), ROUNDS (ab-runtime, 3) and
# DECODER_GRAPH (decoder steps and cpp: decoder, or tiny-decoder) can be set in the environment. Each step logs to
# RESULTS/<step>.log; the engine lives under out/. Every step runs with
# CUBLASLT_WORKSPACE_SIZE=0 unless it is set (as wan-trt's runtime sets it up), runtimes of commits before it too.
set -euo pipefail
export CUBLASLT_WORKSPACE_SIZE=${CUBLASLT_WORKSPACE_SIZE-0}
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-universal}
PRECISION=${PRECISION:-bf16}
BLOCKS=${BLOCKS:-6}
BACKENDS=${BACKENDS:-aoti-plugins+cudagraph,aoti-plugins,torch-compile,torch-eager}
EXPORT=out/${CONFIG}_${PRECISION}_aoti
ENGINE=$EXPORT/engine_aoti_plugins_cuda.pt2
ONNX_EXPORT=out/${CONFIG}_${PRECISION}_onnx
DECODER_GRAPH=${DECODER_GRAPH:-decoder}  # or tiny-decoder (no fused ops: DECODER_OPS=native)
DECODER=out/${CONFIG}_${PRECISION}_${DECODER_GRAPH}
DECODER_OPS=${DECODER_OPS:-$([ "$DECODER_GRAPH" = decoder ] && echo plugins || echo native)}
DECODER_ENGINE=$DECODER/steady/engine_aoti$([ "$DECODER_OPS" = native ] || echo "_$DECODER_OPS")_cuda.pt2
step=${1:?"step: setup | site | build | build-rev | ab | ab-runtime | ab-env | decoder-rev | ab-decoder | bench | check | ort-check | block-end | long | decoder | decoder-bench | cpp | precisions | all"}
results=${2:-bench/results/new}
[ "$step" = setup ] || [ "$step" = site ] || { mkdir -p "$results" && results=$(cd "$results" && pwd); }
tag=${CONFIG}_${PRECISION}

keep_result() {  # file, exit status, log: file.partial becomes file if the command wrote anything (a failed
  # check's report included), so a run that crashes leaves the earlier result whole; then the status
  local file=$1 rc=$2 log=$3
  if [ -s "$file.partial" ]; then mv -f "$file.partial" "$file"; else rm -f "$file.partial"; fi
  [ "$rc" = 0 ] || { tail -20 "$log"; exit "$rc"; }
}

run_step() {  # name, command...: log to RESULTS/name.log, keep the exit status
  local name=$1; shift
  echo "== $name: $*"
  "$@" > >(tee "$results/$name.log") 2>&1
}

case "$step" in
  setup)
    shopt -s nullglob; wheels=("${WHEELS:-.whl}"/*.whl)
    [ ${#wheels[@]} -eq 0 ] || python3 -m pip install -q --no-deps "${wheels[@]}"
    python3 -m pip install -q --no-deps --no-build-isolation -e .
    python3 -c "import torch, wan_trt.engines.runtime.session; print('torch', torch.__version__, torch.cuda.get_device_name())"
    ;;
  build)
    run_step export wan-trt export --config "$CONFIG" --precision "$PRECISION" --no-onnx --out "$EXPORT" --overwrite
    run_step build wan-trt build "$EXPORT" --backend aoti --ops plugins --precision "$PRECISION" --device cuda
    ;;
  bench)
    run_step bench wan-trt bench "$EXPORT" --device cuda --blocks "$BLOCKS" --aoti-plugins-engine "$ENGINE" \
      --backends "$BACKENDS" --overwrite --out "$results/bench_${tag}_engines.json" --chart "$results/bench_${tag}_engines.png"
    ;;
  check)
    rc=0; wan-trt check "$ENGINE" --blocks 4 --json --no-save-results > "$results/check_${tag}_aoti_plugins.json.partial" \
      2> "$results/check.log" || rc=$?
    keep_result "$results/check_${tag}_aoti_plugins.json" "$rc" "$results/check.log"
    tail -3 "$results/check.log"
    ;;
  ort-check)
    run_step export_onnx wan-trt export --config "$CONFIG" --precision "$PRECISION" --out "$ONNX_EXPORT" --overwrite
    rc=0; wan-trt check "$ONNX_EXPORT" --provider cuda --blocks 4 --json --no-save-results \
      > "$results/check_${tag}_ort_cuda.json.partial" 2> "$results/check_ort.log" || rc=$?
    keep_result "$results/check_${tag}_ort_cuda.json" "$rc" "$results/check_ort.log"
    tail -3 "$results/check_ort.log"
    ;;
  decoder)
    run_step export_decoder wan-trt export --config "$CONFIG" --graph "$DECODER_GRAPH" --precision "$PRECISION" \
      --no-onnx --out "$DECODER" --overwrite
    run_step build_decoder wan-trt build "$DECODER" --backend aoti --ops "$DECODER_OPS" --precision "$PRECISION" \
      --device cuda
    [ "${DECODER_CHECK:-1}" = 0 ] && exit 0  # the engines only
    rc=0; wan-trt check "$DECODER_ENGINE" --blocks 3 --json --no-save-results \
      > "$results/check_${tag}_${DECODER_GRAPH}_aoti.json.partial" 2> "$results/check_decoder.log" || rc=$?
    keep_result "$results/check_${tag}_${DECODER_GRAPH}_aoti.json" "$rc" "$results/check_decoder.log"
    tail -1 "$results/check_decoder.log"
    ;;
  decoder-bench)
    if command -v nvidia-smi > /dev/null; then  # the GPU's SM clock, power and throttle reasons beside the run
      nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 200 \
        > "$results/gpu_clocks_decoder_bench.csv" 2>&1 &
      trap "kill $! 2> /dev/null" EXIT
    fi
    run_step bench_decoder wan-trt bench "$EXPORT" --device cuda --blocks "$BLOCKS" --aoti-plugins-engine "$ENGINE" \
      --backends aoti-plugins+cudagraph --decoder "$DECODER" --decoder-engine "$DECODER_ENGINE" \
      --end-to-end aoti-plugins+cudagraph --profile decoder --overwrite \
      --out "$results/bench_${tag}_${DECODER_GRAPH}.json"
    ;;
  cpp)
    baseline=()
    if [ -n "${REV:-}" ]; then  # REV's C++ runtime beside this checkout's, ROUNDS runs of each, alternating
      src=$PWD/out/cpp_src_$REV  # one folder per REV: its build (build/cpp_baseline) is configured for it
      rm -rf "$src" build/cpp_baseline && mkdir -p "$src"
      git archive "$REV" engines/cpp | tar -x -C "$src"
      baseline=(--baseline-source "$src/engines/cpp" --rounds "${ROUNDS:-2}")
    fi
    python3 scripts/cpp_stream.py "$EXPORT" "$ENGINE" "$DECODER_ENGINE" --blocks "${CPP_BLOCKS:-12}" \
      --build-dir build/cpp ${baseline[@]+"${baseline[@]}"} \
      --out "$results/cpp_stream_${tag}$([ "$DECODER_GRAPH" = decoder ] || echo "_$DECODER_GRAPH").json" \
      2> "$results/cpp.log" ||
      { tail -20 "$results/cpp.log"; exit 1; }
    ;;
  block-end)
    python3 scripts/bench_block_end.py "$EXPORT" "$ENGINE" --out "$results/block_end_${tag}.json"
    ;;
  ab-env)  # this checkout's runtime on its engine under two values of one environment variable
    var=${ENV_VAR:-CUBLASLT_WORKSPACE_SIZE}; a=${ENV_A:-0}; b=${ENV_B:-1024}
    runs=$results/time_blocks_env_${tag}.jsonl
    rm -f "$runs"
    for round in $(seq "${ROUNDS:-3}"); do
      for value in "$a" "$b"; do
        env "$var=$value" python3 scripts/time_blocks.py "$var=$value" "$EXPORT" --out "$runs"
      done
    done
    python3 scripts/time_blocks.py --summarize "$runs" --out "$results/ab_env_${tag}.json"
    if [ "${KERNELS:-1}" != 0 ]; then
      for value in "$a" "$b"; do
        env "$var=$value" python3 scripts/block_kernels.py "env_${var}_${value}" "$EXPORT" --out "$results"
      done
    fi
    ;;
  long)
    python3 scripts/long_stream.py "$EXPORT" "$ENGINE" --blocks "${LONG_BLOCKS:-1500}" \
      --out "$results/long_stream_${tag}.json" 2> "$results/long.log"
    ;;
  precisions)
    also=()
    for p in fp16 fp8; do
      other=out/${CONFIG}_${p}_aoti
      [ -f "$other/engine_aoti_plugins_cuda.pt2" ] || { CONFIG=$CONFIG PRECISION=$p "$0" build "$results/$p" || exit 1; }
      also+=(--also-engine "$other/engine_aoti_plugins_cuda.pt2")
    done
    run_step bench_precisions wan-trt bench "$EXPORT" --device cuda --blocks "$BLOCKS" --aoti-plugins-engine "$ENGINE" \
      --backends aoti-plugins+cudagraph,aoti-plugins,torch-compile,torch-eager "${also[@]}" \
      --profile aoti-plugins,aoti-plugins@fp16,aoti-plugins@fp8 --overwrite --out "$results/bench_${CONFIG}_precisions.json"
    ;;
  site|build-rev|ab|ab-runtime|decoder-rev|ab-decoder)
    : "${REV:?set REV to the commit to compare with}"
    if [ -d "$PWD/out/site_$REV/wan_trt" ]; then rev=$REV  # installed already (by `site`, maybe elsewhere)
    else rev=$(git rev-parse --short=12 "$REV^{commit}"); fi
    rev_export=$PWD/out/${CONFIG}_${PRECISION}_aoti_${rev}
    rev_decoder=$PWD/out/${CONFIG}_${PRECISION}_${DECODER_GRAPH}_${rev}
    site=$PWD/out/site_${rev}  # REV's wan_trt, installed apart
    if [ "$step" != ab ] && [ "$step" != ab-decoder ] && [ ! -d "$site/wan_trt" ]; then
      src=$(mktemp -d)
      git archive "$rev" | tar -x -C "$src"
      python3 -m pip install -q --no-deps --no-build-isolation --target "$site" "$src"
    fi
    if [ "$step" = site ]; then
      echo "REV=$rev: out/site_$rev"
    elif [ "$step" = ab-runtime ]; then  # PYTHONPATH first: REV's modules before this checkout's
      runs=$results/time_blocks_${tag}.jsonl
      rm -f "$runs"
      for round in $(seq "${ROUNDS:-3}"); do
        PYTHONPATH=$site python3 scripts/time_blocks.py "rev_$rev" "$EXPORT" --out "$runs"
        python3 scripts/time_blocks.py current "$EXPORT" --out "$runs"
      done
      python3 scripts/time_blocks.py --summarize "$runs" --out "$results/ab_runtime_${tag}.json"
      if [ "${KERNELS:-1}" != 0 ]; then
        PYTHONPATH=$site python3 scripts/block_kernels.py "runtime_rev_$rev" "$EXPORT" --out "$results"
        python3 scripts/block_kernels.py runtime_current "$EXPORT" --out "$results"
      fi
    elif [ "$step" = build-rev ]; then
      # run from the installed copy: in the checkout (or the source tree) python -m finds that wan_trt first
      (cd "$site" && export PYTHONPATH=$site &&
        run_step export_rev python3 -m wan_trt.cli export --config "$CONFIG" --precision "$PRECISION" --no-onnx \
          --out "$rev_export" --overwrite &&
        run_step build_rev python3 -m wan_trt.cli build "$rev_export" --backend aoti --ops plugins \
          --precision "$PRECISION" --device cuda)
    elif [ "$step" = decoder-rev ]; then
      (cd "$site" && export PYTHONPATH=$site &&
        run_step export_decoder_rev python3 -m wan_trt.cli export --config "$CONFIG" --graph "$DECODER_GRAPH" \
          --precision "$PRECISION" --no-onnx --out "$rev_decoder" --overwrite &&
        run_step build_decoder_rev python3 -m wan_trt.cli build "$rev_decoder" --backend aoti --ops "$DECODER_OPS" \
          --precision "$PRECISION" --device cuda)
    elif [ "$step" = ab-decoder ]; then
      run_step ab_decoder python3 scripts/ab_decoder_engines.py "rev=$rev_decoder/steady/$(basename "$DECODER_ENGINE")" \
        "current=$DECODER_ENGINE" --out "$results/ab_decoder_${tag}_${DECODER_GRAPH}.json"
    else
      interleave=()  # INTERLEAVE=N: one stream of N blocks per engine, a block of each in turn
      [ -z "${INTERLEAVE:-}" ] || interleave=(--interleave "$INTERLEAVE")
      run_step ab python3 scripts/ab_engines.py "rev=$rev_export" "current=$EXPORT" ${interleave[@]+"${interleave[@]}"} \
        --out "$results/ab_${tag}.json"
      python3 scripts/block_kernels.py "rev_$rev" "$rev_export" --out "$results"
      python3 scripts/block_kernels.py current "$EXPORT" --out "$results"
    fi
    ;;
  all)
    for s in build bench check; do "$0" "$s" "$results"; done
    ;;
  *)
    echo "unknown step $step" >&2; exit 2
    ;;
esac
