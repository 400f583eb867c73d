"""zoo-onnx: what the backends that consume an ONNX graph share, so that none of them
depends on another (see the README beside this package).

`export` (the ONNX export), `fp16` (the float16 conversion), `quantize` (the int8 steps
ONNX Runtime's and TensorRT's int8 share) and `engines` (the shape profile and provenance
of engines built from the graph). A library, not a plugin: it registers nothing, and
importing this package imports none of torch, onnx or onnxruntime.
"""
