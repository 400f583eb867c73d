#!/usr/bin/env bash
# Every GPU check of the project in one run, on a machine with an NVIDIA GPU:
#   1. the environment (GPU, driver, CUDA, library versions, which backends can run);
#   2. the GPU tests (`needs_cuda`, `needs_tensorrt`), with a JUnit report;
#   3. the GPU benchmark of docs/benchmarks.md ("GPU"): ResNet-50 at batch 1 and 256,
#      the MiniLM encoder at sequence 128, batch 1 and 64, and the CartPole policy at
#      batch 1, on every GPU backend and precision, each combination in its own processes.
# Results go to OUT (default reports/gpu-TIME): env.txt, backends.json, tests.log,
# tests.xml, bench-*/ (report.json, results.csv, report.md, plots). Nothing here changes
# the GPU's settings. Steps go on after a failure; the exit status is 1 if any failed.
#
#   scripts/gpu_validate.sh [OUT]            # everything
#   STEPS=tests scripts/gpu_validate.sh      # only some steps: env, tests, bench (comma-separated)
#   MIN_TIME=0.5 scripts/gpu_validate.sh     # seconds of timed calls per benchmark point
#   BENCH=policy BACKENDS=torch,onnxruntime scripts/gpu_validate.sh   # some benchmarks, some backends
#   WHEELS=.whl scripts/gpu_validate.sh      # an offline machine: install the project and the
#                                            # wheels in .whl first (see docs/gpu-validation.md)
#   SITE=/tmp/zoo-site WHEELS=.whl ...       # install them there once: a later call on the same
#                                            # machine with SITE set (and no WHEELS) reuses them
#   TEST_FILES="tests/a.py tests/b.py" ...   # only these of the GPU test files
#
# A GPU test that skips on this machine fails (tests/conftest.py): a library that failed to
# install or load is not a pass. Where TensorRT cannot be installed (its libraries come only
# from NVIDIA's index), ZOO_GPU_MISSING=tensorrt lets the needs_tensorrt tests skip, each
# with its reason in tests.log.
set -uo pipefail

OUT=${1:-reports/gpu-$(date +%Y%m%d-%H%M%S)}
STEPS=${STEPS:-env,tests,bench}
MIN_TIME=${MIN_TIME:-1}
PYTHON=${PYTHON:-$(command -v .venv/bin/python || command -v python3)}
ZOO=("$PYTHON" -m zoo)
mkdir -p "$OUT"
status=0

if [[ -n ${WHEELS:-} ]]; then
    # No package index here: wheels were brought along. A wheel too large to carry in one
    # piece comes as NAME.whl.part-aa, NAME.whl.part-ab ... (split -b): joined first. They
    # go to a directory of their own, ahead of the system's packages on the path, so that
    # e.g. onnxruntime-gpu shadows a CPU onnxruntime already installed.
    # tools/gpu_wheels.py --download prepares them, with SHA256SUMS of the whole wheels.
    site=${SITE:-$(mktemp -d)/site}; joined=$(mktemp -d)/wheels; mkdir -p "$site" "$joined"
    cp "$WHEELS"/*.whl "$joined"/ 2>/dev/null
    for first in "$WHEELS"/*.whl.part-aa; do
        [[ -e $first ]] || continue
        whl=${first%.part-aa}; cat "$whl".part-* >"$joined/$(basename "$whl")"
    done
    if [[ -e $WHEELS/SHA256SUMS ]]; then
        (cd "$joined" && sha256sum --quiet -c "$WHEELS/SHA256SUMS") || {
            echo "a carried wheel is missing or incomplete (a part lost between calls?): see above" >&2; exit 1; }
    fi
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$joined"/*.whl || exit 1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    # the project itself, editable, so that its plugins' entry points are registered
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation \
        -e . $(printf -- '-e %s ' libs/*/ backends/*/ plugins/*/) || exit 1
fi
if [[ -z ${WHEELS:-} && -n ${SITE:-} ]]; then
    [[ -d $SITE ]] || { echo "SITE=$SITE does not exist: install there first (WHEELS=...)" >&2; exit 1; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
step() { [[ ",$STEPS," == *",$1,"* ]]; }
note() { printf '\n== %s\n' "$*" | tee -a "$OUT/summary.txt"; }

if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "no CUDA device visible to torch ($("$PYTHON" -c 'import torch; print(torch.__version__)')): nothing to validate" >&2
    exit 2
fi

if step env; then
    note "environment"
    { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
      "$PYTHON" - <<'PY'
import importlib, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuDNN", torch.backends.cudnn.version())
print("GPU", torch.cuda.get_device_name(), "| compute capability %d.%d" % torch.cuda.get_device_capability())
for lib in ("triton", "onnx", "onnxruntime", "tensorrt"):
    try:
        module = importlib.import_module(lib)
        extra = f" providers={module.get_available_providers()}" if lib == "onnxruntime" else ""
        print(lib, module.__version__ + extra)
    except Exception as exc:  # noqa: BLE001 - report, do not stop
        print(lib, "unavailable:", f"{type(exc).__name__}: {exc}"[:200])
PY
    } 2>&1 | tee "$OUT/env.txt"
    "${ZOO[@]}" backends --device cuda --json >"$OUT/backends.json" 2>>"$OUT/env.txt" || status=1
    "${ZOO[@]}" backends --device cuda | tee -a "$OUT/summary.txt"
fi

if step tests; then
    note "GPU tests (needs_cuda, needs_tensorrt)"
    # only the files that hold GPU tests: collecting the others would import what the GPU
    # machine need not have (schemathesis, kserve, ray), and one collection error stops pytest
    mapfile -t gpu_files < <(grep -l -E "mark\.needs_(cuda|tensorrt)" ${TEST_FILES:-tests/test_*.py})
    # a test that hangs (a compile that never ends) fails alone instead of taking the loan with it
    "$PYTHON" -m pytest -m "needs_cuda or needs_tensorrt" -rs -v --junitxml="$OUT/tests.xml" \
        -p no:cacheprovider --timeout "${TEST_TIMEOUT:-240}" "${gpu_files[@]}" 2>&1 | tee "$OUT/tests.log" | tail -n 40 | tee -a "$OUT/summary.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

bench() {  # NAME MODEL ARGS...: one `zoo bench` run into OUT/bench-NAME
    local name=$1; shift
    note "bench $name: $*"
    "${ZOO[@]}" bench "$@" --device cuda --min-time "$MIN_TIME" --report-dir "$OUT/bench-$name" \
        2>>"$OUT/bench-$name.log" | tee -a "$OUT/summary.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
}

if step bench; then
    # eager torch and ONNX Runtime CUDA first: the compiling backends (max-autotune, AOTInductor,
    # TensorRT builds) take minutes each, and a short loan should yield the quick rows first
    BACKENDS=${BACKENDS:-torch,onnxruntime,torch-compile,torch-aoti,onnxruntime-trt,tensorrt}
    BENCH=${BENCH:-resnet50,minilm,policy}
    wanted() { [[ ",$BENCH," == *",$1,"* ]]; }
    # ResNet-50 and the CartPole policy have no trained weights here unless a checkpoint is
    # given: speed does not depend on the weights, and the report says "random init".
    wanted resnet50 && bench resnet50 resnet50 --backends "$BACKENDS" --precision fp32,fp16,bf16,int8 --batch-sizes 1,256 \
        --random-init
    wanted minilm && bench minilm minilm-l6.all-v2 --backends "$BACKENDS" --precision fp32,fp16,bf16,int8 --batch-sizes 1,64 \
        --lengths 128
    policy_weights=(--random-init)
    [[ -d checkpoints/ppo.cartpole ]] && policy_weights=(--checkpoint checkpoints/ppo.cartpole)
    wanted policy && bench policy ppo.cartpole --backends "$BACKENDS" --precision fp32,fp16,bf16 --batch-sizes 1 \
        "${policy_weights[@]}"
fi

echo "results in $OUT (exit $status)"
exit $status
