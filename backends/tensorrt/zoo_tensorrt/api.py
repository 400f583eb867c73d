"""Every TensorRT call that differs between TensorRT 10.x and 11.x, in one place.

The plugin builds one way on both majors: a strongly typed network whose types are the
ONNX graph's (fp32 as exported, fp16 from the fp16 graph, int8 from the Q/DQ graph), and
no precision flag. That is the only way TensorRT 11 builds at all ("TensorRT 11.x
removes all weak typing APIs", Migrating from TensorRT 10.x to 11.x), and on 10.x it is
the mode NVIDIA recommends since weak typing was deprecated in 10.12. What still differs
is asked here, never elsewhere:

- Creating the network. TensorRT 10 opts in with "1 << int(NetworkDefinitionCreationFlag
  .STRONGLY_TYPED)" passed to `Builder.create_network` (TensorRT 10 Python API, Builder:
  "STRONGLY_TYPED: Specify that every tensor in the network has a data type defined in
  the network following only type inference rules"). On 11.x every network is strongly
  typed and the flag "is accepted but ignored"; it is still passed where the enum has it,
  and left out (flags 0) where a release has dropped the member.
- IEEE fp32. `BuilderFlag.TF32` is on by default in both majors (inner products on 10-bit
  mantissas); fp32 engines clear it. It is not among the flags 11.x removed (Removed
  Python APIs and Replacements, TensorRT 11.4).
- The flags 11.x removed (`REMOVED_IN_11` below: FP16, INT8, BF16, FP8, INT4, FP4,
  OBEY/PREFER_PRECISION_CONSTRAINTS, DIRECT_IO, the int8 calibrator) are never touched,
  on either major: fp16 and int8 come from the graph.

`SUPPORTED_MAJORS` is what the extras admit (`tensorrt>=10,<12`); any other major is
refused by `probe` with the version it found, before a build could fail halfway.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from zoo.errors import BackendUnavailableError

#: the TensorRT majors this plugin is written against (its extras: tensorrt>=10,<12)
SUPPORTED_MAJORS = (10, 11)

#: `BuilderFlag` members TensorRT 11 removed (TensorRT 11.4, Removed Python APIs and
#: Replacements). The builder must not use them on any major: precision is the graph's.
REMOVED_IN_11 = ("FP16", "INT8", "FP8", "BF16", "INT4", "FP4", "OBEY_PRECISION_CONSTRAINTS",
                 "PREFER_PRECISION_CONSTRAINTS", "DIRECT_IO")


def major(trt: ModuleType) -> int:
    """The installed TensorRT's major version, from `trt.__version__` ("11.4.0.106" -> 11)."""
    try:
        return int(str(trt.__version__).split(".")[0])
    except (AttributeError, ValueError) as exc:
        raise BackendUnavailableError(f"cannot read the TensorRT version from {getattr(trt, '__version__', None)!r}") \
            from exc


def check_version(trt: ModuleType) -> None:
    """BackendUnavailableError unless the installed TensorRT is a major this plugin supports."""
    found = major(trt)
    if found not in SUPPORTED_MAJORS:
        supported = " and ".join(f"{m}.x" for m in SUPPORTED_MAJORS)
        raise BackendUnavailableError(
            f"TensorRT {trt.__version__} is installed; zoo-tensorrt is written for TensorRT {supported} "
            f"(pip install 'zoo-tensorrt[gpu]' installs a supported one)")


def strongly_typed_flags(trt: ModuleType) -> int:
    """The `create_network` flags of a strongly typed network on this TensorRT."""
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if flag is None:  # a release that dropped the member: its networks are strongly typed anyway
        if major(trt) < 11:
            raise BackendUnavailableError(
                f"TensorRT {trt.__version__} has no strongly typed networks (STRONGLY_TYPED came in 9.1)")
        return 0
    return 1 << int(flag)


def ieee_fp32(trt: ModuleType, config: Any) -> None:
    """Make fp32 layers compute in IEEE fp32: clear TF32, which both majors enable by default."""
    config.clear_flag(trt.BuilderFlag.TF32)
