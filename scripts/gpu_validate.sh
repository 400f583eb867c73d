#!/usr/bin/env bash
# Every GPU check of the project in one run, on a machine with an NVIDIA GPU:
#   1. the environment (GPU, driver, CUDA, library versions, which backends can run);
#   2. the GPU tests (`needs_cuda`, `needs_tensorrt`), with a JUnit report;
#   3. the GPU benchmark of docs/benchmarks.md ("GPU"): ResNet-50 at batch 1 and 256,
#      the MiniLM encoder at sequence 128, batch 1 and 32, and the CartPole policy at
#      batch 1, on every GPU backend and precision, each combination in its own processes.
# Results go to OUT (default reports/gpu-TIME): env.txt, backends.json, tests.log,
# tests.xml, bench-*/ (report.json, results.csv, report.md, plots). Nothing here changes
# the GPU's settings. Steps go on after a failure; the exit status is 1 if any failed.
#
#   scripts/gpu_validate.sh [OUT]            # everything
#   STEPS=tests scripts/gpu_validate.sh      # only some steps: env, tests, bench (comma-separated)
#   MIN_TIME=0.5 scripts/gpu_validate.sh     # seconds of timed calls per benchmark point
#   BENCH=policy BACKENDS=torch,onnxruntime scripts/gpu_validate.sh   # some benchmarks, some backends
#   PRECISION=fp32,fp16 scripts/gpu_validate.sh   # some precisions (default: every one each model offers)
#   WHEELS=.whl scripts/gpu_validate.sh      # an offline machine: install the project and the
#                                            # wheels in .whl first (see docs/gpu-validation.md)
#   SITE=/tmp/zoo-site WHEELS=.whl/1 ...     # install there what has come: a later call on the same
#                                            # machine with SITE (and WHEELS=.whl/2 ...) adds to it
#   TEST_FILES="tests/a.py tests/b.py" ...   # only these of the GPU test files
#   TEST_K="not torch-aoti" ...              # only the GPU tests pytest's -k selects
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
    # No package index here: the files were brought along, a folder per device call
    # (tools/gpu_wheels.py --download): wheels, onnxruntime-gpu as an xz tarball of its
    # wheel's contents, Debian packages of system libraries, a file too large for one call
    # in parts (NAME.part-aa ...). Each call adds its folder to SITE/.stage and installs
    # every file whose parts have all come, checked against SHA256SUMS first (a part lost
    # to a machine released between calls stops the run with that reason, instead of a
    # broken install). Installed to SITE, ahead of the system's packages on the path, so
    # that onnxruntime-gpu shadows a CPU onnxruntime already there.
    WHEELS=$(cd "$WHEELS" && pwd)
    site=${SITE:-$(mktemp -d)/site}; stage=$site/.stage; done_dir=$site/.installed
    mkdir -p "$stage" "$done_dir"
    cp "$WHEELS"/* "$stage"/ 2>/dev/null
    [[ -e $stage/SHA256SUMS ]] || { echo "no SHA256SUMS among the carried files: bring folder 1 first" >&2; exit 1; }
    wheels=(); arrived=()
    while read -r sum name; do
        [[ -e $done_dir/$name ]] && continue
        if [[ ! -e $stage/$name ]]; then
            want=$(awk -v n="$name" '$2 == n {print $1}' "$stage/PARTS" 2>/dev/null)
            have=$(find "$stage" -maxdepth 1 -name "$name.part-*" | wc -l)
            if [[ -z $want ]]; then echo "$name: not carried" >&2; status=1; continue; fi
            if (( have < want )); then echo "$name: $have of $want parts here; it installs once all have come"; continue; fi
            cat "$stage/$name".part-* >"$stage/$name" && rm -f "$stage/$name".part-*
        fi
        echo "$sum  $stage/$name" | sha256sum --quiet -c - ||
            { echo "$name does not match SHA256SUMS (a part lost or damaged between calls?)" >&2; exit 1; }
        case $name in
            *.whl) wheels+=("$stage/$name") ;;
            *.tar.xz) tar -C "$site" -xJf "$stage/$name" || exit 1 ;;
            *.deb) dpkg -x "$stage/$name" "$site/.system" || exit 1 ;;
        esac
        arrived+=("$name")
    done <"$stage/SHA256SUMS"
    if (( ${#wheels[@]} )); then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "${wheels[@]}" || exit 1
    fi
    for name in "${arrived[@]}"; do : >"$done_dir/$name"; rm -f "$stage/$name"; done
    # system libraries: only those the machine lacks (its own stay in use)
    for lib in "$site"/.system/usr/lib/x86_64-linux-gnu/*.so.[0-9]; do
        [[ -e $lib ]] && ldconfig -p | grep -q "^[[:space:]]*$(basename "$lib") " && rm -f "$lib"
    done
    # the project itself, editable, so that its plugins' entry points are registered (once per machine)
    if [[ ! -e $done_dir/zoo-editable ]]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation \
            -e . $(printf -- '-e %s ' libs/*/ backends/*/ plugins/*/) || exit 1
        : >"$done_dir/zoo-editable"
    fi
    SITE=$site
fi
if [[ -n ${SITE:-} ]]; then
    [[ -d $SITE ]] || { echo "SITE=$SITE does not exist: install there first (WHEELS=...)" >&2; exit 1; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    system_libs=$SITE/.system/usr/lib/x86_64-linux-gnu
    [[ -d $system_libs ]] && export LD_LIBRARY_PATH="$system_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
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
    "$PYTHON" -m pytest -m "needs_cuda or needs_tensorrt" ${TEST_K:+-k "$TEST_K"} -rs -v --junitxml="$OUT/tests.xml" \
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
    wanted resnet50 && bench resnet50 resnet50 --backends "$BACKENDS" --precision "${PRECISION:-fp32,fp16,bf16,int8}" --batch-sizes 1,256 \
        --random-init
    wanted minilm && bench minilm minilm-l6.all-v2 --backends "$BACKENDS" --precision "${PRECISION:-fp32,fp16,bf16,int8}" --batch-sizes 1,32 \
        --lengths 128 --random-init
    policy_weights=(--random-init)
    [[ -d checkpoints/ppo.cartpole ]] && policy_weights=(--checkpoint checkpoints/ppo.cartpole)
    wanted policy && bench policy ppo.cartpole --backends "$BACKENDS" --precision "${PRECISION:-fp32,fp16,bf16}" --batch-sizes 1 \
        "${policy_weights[@]}"
fi

echo "results in $OUT (exit $status)"
exit $status
