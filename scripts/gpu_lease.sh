#!/usr/bin/env bash
# One call of a short GPU loan (docs/gpu-validation.md, "On a machine without network
# access"): call K carries .whl/K (tools/gpu_wheels.py --download .whl), stages it with what
# earlier calls brought, and does the work that what has arrived allows, so that no call
# only carries. Results come back as $OUT/gK.tgz (a call returns at most 8 files).
#
#   scripts/gpu_lease.sh 1   # install; the environment; the PyTorch GPU tests but AOTInductor's,
#                            # whose loader crash (two runs, torch 2.11) call 2 probes      (~2 min)
#   scripts/gpu_lease.sh 2   # AOTInductor's CUDA loader probe (tools/aoti_cuda_probe.py) (~2 min)
#   scripts/gpu_lease.sh 3   # the policy benchmark, fp32: torch, torch-compile with CUDA graphs   (~2 min)
#   scripts/gpu_lease.sh 4   # onnxruntime-gpu complete: its GPU tests; ResNet-50 and MiniLM on torch
#                            # and onnxruntime, fp32 and fp16, side by side                (~5 min)
#
# Run the calls back to back: the machine keeps what was staged only while it is warm (30 s
# after a call). Each step runs under `timeout` so that the call returns with its results.
set -uo pipefail
k=${1:?which call: 1, 2, 3 or 4}
OUT=${OUT:-reports/lease}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SITE=/tmp/zoo-site PYTHON=${PYTHON:-python3} ZOO_GPU_MISSING=tensorrt MIN_TIME=${MIN_TIME:-0.3}
run() { timeout "$1" env WHEELS=".whl/$k" "${@:2}" scripts/gpu_validate.sh "$OUT/g$k"; }
case $k in
    1) run 420 STEPS=env,tests TEST_K="not torch-aoti" TEST_FILES="tests/test_backend_torch_compiled.py
        tests/test_gpu_markers.py tests/test_backend_tensorrt.py tests/test_tensorrt_int8.py" ;;
    2) run 60 STEPS=none
       timeout 240 env PYTHONPATH="$SITE" python3 tools/aoti_cuda_probe.py "$OUT/g$k/aoti-probe.json" \
           2>"$OUT/g$k/aoti-probe.log" ;;
    3) run 150 STEPS=bench BENCH=policy BACKENDS=torch,torch-compile PRECISION=fp32 ;;
    4) run 120 STEPS=tests TEST_FILES="tests/test_onnxruntime_gpu_paths.py tests/test_backend_onnxruntime.py"
       run 300 STEPS=bench BENCH=resnet50,minilm BACKENDS=torch,onnxruntime PRECISION=fp32,fp16 ;;
    *) echo "no call $k" >&2; exit 2 ;;
esac
status=$?
tar czf "$OUT/g$k.tgz" -C "$OUT" "g$k" && rm -rf "${OUT:?}/g$k"
echo "call $k: exit $status; $OUT/g$k.tgz"
exit $status
