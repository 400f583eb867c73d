#!/usr/bin/env bash
# A real NVIDIA Triton server (2.51, CPU, no container) for the tests and the benchmarks
# that compare `zoo serve` with it: the `tritonserver` binary and its Python backend, as
# the nvidia-pytriton 0.7.0 wheel on PyPI bundles them, laid out under $TRITON_HOME.
#
#   $TRITON_HOME/bin/tritonserver
#   $TRITON_HOME/lib/                      the wheel's bundled shared libraries
#   $TRITON_HOME/backends/python/          libtriton_python.so, triton_python_backend_utils.py,
#                                          triton_python_backend_stub (this Python's minor version)
#   $TRITON_HOME/env/                      the Python environment Python-backend models run in
#   $TRITON_HOME/bin/perf_analyzer         Triton's load generator of the same release (from
#                                          tritonclient 2.51.0's manylinux wheel), run against
#                                          `zoo serve` by tests/test_serve_perf_analyzer.py
#
# The stub takes its packages from the prefix of the `python3` first on PATH, not from
# PYTHONPATH, and this Triton predates numpy 2 (a pb_utils.Tensor made from a numpy-2
# array comes back empty): so models run in an environment of their own, made from the
# same interpreter as $VENV, with numpy<2 first and $VENV's packages (zoo and its plugins,
# editable) after it through a .pth file. `tools/tritonserver.py` starts the server.
#
# Usage: scripts/triton_setup.sh VENV TRITON_HOME
set -euo pipefail
VENV=${1:-.venv}
TRITON_HOME=${2:-.triton}
WHEEL_VERSION=0.7.0

PY="$VENV/bin/python"
minor=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
rm -rf "$TRITON_HOME.tmp"
mkdir -p "$TRITON_HOME.tmp/wheel"
"$PY" -m pip download -q --no-deps --only-binary=:all: "nvidia-pytriton==$WHEEL_VERSION" -d "$TRITON_HOME.tmp/wheel"
"$PY" - "$TRITON_HOME.tmp" <<'EOF'
import sys, zipfile, pathlib
root = pathlib.Path(sys.argv[1])
wheel, = (root / "wheel").glob("nvidia_pytriton-*.whl")
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith(("pytriton/tritonserver/", "nvidia_pytriton.libs/"))]
    z.extractall(root / "x", members)
EOF
src="$TRITON_HOME.tmp/x/pytriton/tritonserver"
stub="$src/python_backend_stubs/$minor/triton_python_backend_stub"
test -f "$stub" || { echo "nvidia-pytriton $WHEEL_VERSION has no Python backend stub for Python $minor" >&2; exit 1; }
mkdir -p "$TRITON_HOME.tmp/bin" "$TRITON_HOME.tmp/backends/python"
mv "$src/bin/tritonserver" "$TRITON_HOME.tmp/bin/"
mv "$TRITON_HOME.tmp/x/nvidia_pytriton.libs" "$TRITON_HOME.tmp/lib"
mv "$src/backends/python/libtriton_python.so" "$src/backends/python/triton_python_backend_utils.py" "$stub" \
   "$TRITON_HOME.tmp/backends/python/"
chmod +x "$TRITON_HOME.tmp/bin/tritonserver" "$TRITON_HOME.tmp/backends/python/triton_python_backend_stub"
rm -rf "$TRITON_HOME.tmp/x" "$TRITON_HOME.tmp/wheel"

# perf_analyzer links libb64 and libcudart (it runs without a GPU), which the server's wheel
# bundles under hashed names: link the names it asks for
"$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 "tritonclient==2.51.0" \
    -d "$TRITON_HOME.tmp/wheel"
"$PY" - "$TRITON_HOME.tmp" <<'EOF'
import sys, zipfile, pathlib
root = pathlib.Path(sys.argv[1])
wheel, = (root / "wheel").glob("tritonclient-*.whl")
with zipfile.ZipFile(wheel) as z:
    (root / "bin" / "perf_analyzer").write_bytes(z.read("tritonclient-2.51.0.data/data/bin/perf_analyzer"))
EOF
chmod +x "$TRITON_HOME.tmp/bin/perf_analyzer"
(cd "$TRITON_HOME.tmp/lib" && ln -sf libb64-*.so.0d libb64.so.0d && ln -sf libcudart-*.so.12* libcudart.so.12)
LD_LIBRARY_PATH="$TRITON_HOME.tmp/lib" "$TRITON_HOME.tmp/bin/perf_analyzer" --version
rm -rf "$TRITON_HOME.tmp/wheel"

rm -rf "$TRITON_HOME"
mv "$TRITON_HOME.tmp" "$TRITON_HOME"

# the models' environment: same interpreter, numpy<2 first, then $VENV's site-packages
base=$("$PY" -c 'import sys; print(sys._base_executable)')
"$base" -m venv "$TRITON_HOME/env"
"$TRITON_HOME/env/bin/python" -m pip install -q "numpy<2"
venv_site=$(cd "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" && pwd)
env_site=$("$TRITON_HOME/env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$venv_site')" > "$env_site/zoo_venv.pth"
"$TRITON_HOME/env/bin/python" -c 'import numpy, zoo; assert numpy.__version__ < "2", numpy.__version__'
echo "tritonserver $WHEEL_VERSION (Triton 2.51) in $TRITON_HOME"
