# NVIDIA's Triton image with zoo installed, so that its Python backend can serve zoo's
# python-form artifacts (`torch`, `torch-compile`, `torch-aoti`, and any `--triton python`
# export): their 1/model.py imports zoo.triton_backend and runs the artifact through zoo's
# runner. Native-form artifacts (onnxruntime_onnx, tensorrt_plan, openvino) need none of
# this: NVIDIA's image serves them as it is. docs/deploy.md gives the commands.
#
#   pip wheel --no-deps . libs/onnx backends/torch backends/onnxruntime plugins/vision -w dist
#   docker build -f deploy/triton.Dockerfile -t REGISTRY/zoo-triton:0.1 .
#
# Install the wheels of the backends (and, for pre/post-processing, domain plugins) that
# the repository's artifacts name. TensorRT engines and AOTInductor packages are bound to
# the versions that built them (`zoo verify` refuses others): TORCH_VERSION pins the torch
# that exported the artifacts, by default the one requirements.txt pins
# (`--build-arg TORCH_VERSION=...` for another).
ARG TRITON_VERSION=24.08-py3
FROM nvcr.io/nvidia/tritonserver:${TRITON_VERSION}
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu124
COPY dist/ /tmp/zoo-wheels/
# zoo needs Python >= 3.10 (the image's python3 is the one the Python backend stub embeds).
# numpy < 2: Triton 2.51 (the release the tests run) makes an empty pb_utils.Tensor from a
# numpy-2 array; drop the pin only for a Triton known to handle numpy 2.
RUN python3 -c "import sys; assert sys.version_info >= (3, 10), sys.version" \
 && python3 -m pip install --no-cache-dir --extra-index-url "$TORCH_INDEX" \
        "numpy<2" "torch==${TORCH_VERSION}" /tmp/zoo-wheels/*.whl \
 && rm -rf /tmp/zoo-wheels \
 && python3 -c "import zoo.triton_backend"
