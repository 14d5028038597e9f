#!/usr/bin/env bash
# Stages of one GPU session (device machine: torch + CUDA, no internet). Each stage logs under out/gpu/.
#   scripts/gpu_session.sh setup            pip install this checkout (and carried wheels from /tmp/gpusite)
#   scripts/gpu_session.sh smoke DIR        real-GPU kernel tests + a small --ops plugins AOTI engine, checked
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
