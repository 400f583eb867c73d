"""The optimization profile a TensorRT engine is built for, derived from a `ModelSpec`.

It lives in the core (`zoo.engines`), shared with ONNX Runtime's TensorRT execution
provider so that both TensorRT paths build the same profile; these names stay here for
the plugin's modules and for callers that imported them from this module.
"""

from zoo.engines import Profile, ShapeRange, check_shape, describe, profile_for, profile_from_json, profile_to_json

__all__ = ["Profile", "ShapeRange", "check_shape", "describe", "profile_for", "profile_from_json",
           "profile_to_json"]
