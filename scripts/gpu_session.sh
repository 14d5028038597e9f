#!/usr/bin/env bash
# Stages of one GPU session (device machine: torch + CUDA, no internet). Each stage logs under out/gpu/.
#   scripts/gpu_session.sh setup            pip install this checkout (and carried wheels from /tmp/gpusite)
#   scripts/gpu_session.sh smoke DIR        real-GPU kernel tests + a small --ops plugins AOTI engine, checked
#   scripts/gpu_session.sh export-bg        export universal bf16 (native) in the background
#   scripts/gpu_session.sh wait-export      block until that export finished
#   scripts/gpu_session.sh aoti-bg          build the universal AOTInductor engines (native, plugins) in the background
#   scripts/gpu_session.sh wait-aoti        block until both are built
#   scripts/gpu_session.sh engine-bench DIR universal bf16 AOTI engine (fused kernels): build, check, bench
#   scripts/gpu_session.sh full-bg          in the background, side by side: (a) export without ONNX ->
#                                           AOTI --ops plugins build -> 4-block engine check; (b) the ONNX export
#   scripts/gpu_session.sh wait-full SECS   wait for both (at most SECS), print their progress
#   scripts/gpu_session.sh bench-all DIR    one wan-trt bench: eager, torch.compile, ONNX Runtime CUDA,
#                                           the AOTI engine with and without CUDA graphs; copies logs to DIR
# Results for bench/results/ are written by the python scripts to the paths they are given.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/gpusite:${PYTHONPATH:-}
mkdir -p out/gpu
EXPORT=out/universal_bf16_native
stage=${1:?stage}

wait_for() {  # wait_for FILE PROCESS_REGEX LOG: until FILE exists; fail if the process died first
  while [ ! -f "$1" ]; do
    if ! pgrep -f "$2" > /dev/null; then echo "background job died:"; tail -30 "$3"; exit 1; fi
    sleep 5
  done
  grep "\[wan-trt\]" "$3" | tail -12
}
case "$stage" in
  setup)
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "root user" || true
    python3 -c "import wan_trt.engines.session, torch; print('wan-trt ok, torch', torch.__version__, torch.cuda.get_device_name())"
    python3 -c "import importlib.util as u; missing = [m for m in ('polygraphy', 'onnxruntime') if not u.find_spec(m)]; \
print('missing (carry the gpu-wheels parts for check/onnxruntime):', missing) if missing else None"
    ;;
  smoke)
    out=${2:?out dir}
    mkdir -p "$out"
    tests_rc=0; python3 -m pytest -q -rfs tests/plugins -p no:cacheprovider > "$out/pytest_plugins.log" 2>&1 || tests_rc=$?
    tail -8 "$out/pytest_plugins.log"
    rm -rf out/smoke && wan-trt export --config universal-small --precision bf16 --out out/smoke
    wan-trt build out/smoke --backend aoti --ops plugins --device cuda
    wan-trt check out/smoke/engine_aoti_plugins_cuda.pt2 --blocks 8 --json > "$out/smoke_check_aoti_plugins.json" || echo "check failed"
    python3 - "$out/smoke_check_aoti_plugins.json" <<'PY'
import json, sys; r = json.load(open(sys.argv[1])); print("smoke aoti-plugins ok:", r["ok"], [round(o["rel_l2"], 5) for o in r["single_pass"]])
PY
    exit $tests_rc
    ;;
  export-bg)
    setsid nohup wan-trt export --config universal --precision bf16 --out $EXPORT --overwrite > out/gpu/export.log 2>&1 < /dev/null &
    echo "export started"
    ;;
  wait-export)
    wait_for $EXPORT/manifest.json "wan-trt expor[t]" out/gpu/export.log
    ;;
  export-aoti-bg)
    setsid nohup bash -c "wan-trt export --config universal --precision bf16 --out $EXPORT --overwrite && wan-trt build $EXPORT --backend aoti --device cuda" > out/gpu/chain.log 2>&1 < /dev/null &
    echo "export + native AOTI build started"
    ;;
  wait-chain)
    wait_for $EXPORT/engine_aoti_cuda.pt2.json "wan-trt (expor[t]|buil[d])" out/gpu/chain.log
    ;;
  aoti-bg)
    setsid nohup bash -c "wan-trt build $EXPORT --backend aoti --device cuda && wan-trt build $EXPORT --backend aoti --ops plugins --device cuda" > out/gpu/aoti.log 2>&1 < /dev/null &
    echo "aoti builds started"
    ;;
  wait-aoti)
    wait_for $EXPORT/engine_aoti_plugins_cuda.pt2.json "wan-trt buil[d]" out/gpu/aoti.log
    ;;
  probe)
    # each step in its own process: a crash (segfault) is recorded and the next step still runs
    out=${2:?out dir}
    rm -rf out/probe && wan-trt export --config universal-small --precision bf16 --out out/probe > out/gpu/probe.log 2>&1
    for ops in native plugins; do
      rc=0; wan-trt build out/probe --backend aoti --ops $ops --device cuda >> out/gpu/probe.log 2>&1 || rc=$?
      echo "build $ops rc=$rc"
      suffix=$([ $ops = native ] && echo "" || echo "_$ops")
      rc=0; wan-trt check out/probe/engine_aoti${suffix}_cuda.pt2 --blocks 8 --json > "$out/probe_check_aoti_$ops.json" \
        2>> out/gpu/probe.log || rc=$?
      echo "check $ops rc=$rc"
    done
    tail -5 out/gpu/probe.log
    ;;
  engine-bench)
    # universal bf16 AOTInductor engine with the fused kernels: build (no ONNX needed), multi-block
    # check against the fp32 reference, then one bench run beside eager and torch.compile.
    # Each step logs to DIR/<step>.log; the tail is shown when it fails.
    out=${2:?out dir}; exp=out/universal_bf16_aoti; engine=$exp/engine_aoti_plugins_cuda.pt2
    mkdir -p "$out"
    step() { local name=$1; shift; if "$@" > "$out/$name.log" 2>&1; then grep "\[wan-trt\]" "$out/$name.log" | tail -4;
             else echo "$name failed:"; tail -25 "$out/$name.log"; return 1; fi; }
    step export wan-trt export --config universal --precision bf16 --no-onnx --out $exp --overwrite
    step build wan-trt build $exp --backend aoti --ops plugins --device cuda
    step check wan-trt check $engine --blocks 2 --json || true
    step bench wan-trt bench $exp --blocks 4 --aoti-plugins-engine $engine --profile aoti-plugins \
      --backends aoti-plugins+cudagraph,aoti-plugins,torch-eager,torch-compile --out "$out/bench.json" --chart "$out/bench.png"
    ;;
  full-bg)
    aexp=out/universal_bf16_aoti
    rm -f out/gpu/engine.rc out/gpu/onnx.rc out/gpu/check_aoti_plugins.json  # nothing stale is reported
    # each job writes its exit status to <job>.rc.tmp and renames it, so a reader never sees it half-written
    setsid nohup bash -c "{ wan-trt export --config universal --precision bf16 --no-onnx --out $aexp --overwrite \
        && wan-trt build $aexp --backend aoti --ops plugins --device cuda \
        && wan-trt check $aexp/engine_aoti_plugins_cuda.pt2 --blocks 4 --json > out/gpu/check_aoti_plugins.json; } \
        > out/gpu/engine.log 2>&1; echo \$? > out/gpu/engine.rc.tmp; mv out/gpu/engine.rc.tmp out/gpu/engine.rc" \
        < /dev/null > /dev/null 2>&1 &
    setsid nohup bash -c "wan-trt export --config universal --precision bf16 --out $EXPORT --overwrite \
        > out/gpu/onnx.log 2>&1; echo \$? > out/gpu/onnx.rc.tmp; mv out/gpu/onnx.rc.tmp out/gpu/onnx.rc" \
        < /dev/null > /dev/null 2>&1 &
    echo "engine chain and ONNX export started"
    ;;
  wait-full)
    # exits 0 only when both jobs finished with status 0
    deadline=$(( $(date +%s) + ${2:?seconds} ))
    while [ ! -f out/gpu/engine.rc ] || [ ! -f out/gpu/onnx.rc ]; do
      [ "$(date +%s)" -lt "$deadline" ] || break
      sleep 5
    done
    ok=1
    for job in engine onnx; do
      rc=$(cat out/gpu/$job.rc 2>/dev/null || echo running)
      echo "== $job: rc=$rc"
      grep "\[wan-trt\]" out/gpu/$job.log | tail -6 || true
      [ "$rc" = 0 ] || ok=0
      if [ "$rc" != 0 ] && [ "$rc" != running ]; then tail -25 out/gpu/$job.log; fi
    done
    [ $ok = 1 ]
    ;;
  bench-all)
    out=${2:?out dir}; mkdir -p "$out"
    for job in engine onnx; do  # timings are only taken on a quiet GPU, with both inputs complete
      [ "$(cat out/gpu/$job.rc 2>/dev/null)" = 0 ] || { echo "full-bg job $job has not finished with status 0"; exit 1; }
    done
    cp out/gpu/engine.log out/gpu/onnx.log out/gpu/check_aoti_plugins.json "$out/"
    wan-trt bench $EXPORT --blocks 4 --aoti-plugins-engine out/universal_bf16_aoti/engine_aoti_plugins_cuda.pt2 \
      --backends aoti-plugins+cudagraph,aoti-plugins,onnxruntime,torch-compile,torch-eager \
      --profile aoti-plugins,torch-compile --out "$out/bench.json" --chart "$out/bench.png" > "$out/bench.log" 2>&1 \
      || { echo "bench failed:"; tail -25 "$out/bench.log"; exit 1; }
    grep "\[wan-trt\]" "$out/bench.log" | tail -12
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
