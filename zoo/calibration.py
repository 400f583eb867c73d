"""Calibration inputs for post-training quantization.

Static int8 quantization fixes every activation's scale from the ranges it sees while
running a few batches (ONNX Runtime's `CalibrationDataReader`, NNCF's
`nncf.Dataset`). Those batches must look like what the model meets in use, so they
come from the model's own training split: never the test split the task metric is
reported on, which would flatter the int8 artifact. Models without a dataset (random-
init ImageNet CNNs, the pretrained MiniLM encoder, policies trained in an environment)
fall back to `spec.sample`, which every plugin writes to give realistic inputs (real
sentences for MiniLM, observations met in the environment for the policies).

Every backend's quantizer calls `calibration_batches`, so all of them calibrate on
exactly the same inputs and their int8 artifacts compare fairly.
"""

from __future__ import annotations

import numpy as np

from .errors import ZooError
from .inputs import load_split
from .spec import ModelSpec

#: ONNX Runtime's and NNCF's examples calibrate on 100-300 samples; more rarely moves
#: a MinMax range and costs calibration time linearly.
DEFAULT_SAMPLES = 128
#: spec dtypes numpy spells otherwise (or cannot hold: bfloat16 stays as the plugin gave it).
_NUMPY = {"string": None, "bfloat16": None}


def calibration_batches(spec: ModelSpec, samples: int = DEFAULT_SAMPLES, batch_size: int | None = None,
                        seed: int = 0) -> list[dict[str, np.ndarray]]:
    """`samples` inputs in batches of `batch_size`, the same for the same arguments.

    Drawn without replacement from `spec.dataset.load("train")` (a seeded random subset,
    so every class or topic is likely represented), else made by `spec.sample`.
    `batch_size` defaults to the typical batch of the spec's range and is clipped to it;
    the last batch may be smaller (without a dataset, the last of each typical-batch draw).
    """
    if samples < 1:
        raise ZooError(f"calibration needs at least one sample, got {samples}")
    limits = spec.axes["batch"]
    batch = min(max(batch_size or limits.opt, limits.min), limits.max)
    rng = np.random.default_rng(seed)
    if spec.dataset is None:
        # drawn in typical batches whatever `batch_size` asks (a rollout or a random length per
        # draw: draws of another size are other data), then cut into `batch`: every backend
        # calibrates on the same rows, ONNX Runtime (typical batches) and OpenVINO (one by one)
        typical = min(max(limits.opt, limits.min), limits.max)
        # (each draw cut on its own: draws may differ in a dynamic axis, and never share a batch)
        rows = {t.name for t in spec.inputs if t.shape[:1] == ("batch",)}  # side inputs go whole
        draws = [_typed(spec, spec.sample(min(typical, samples - i), rng)) for i in range(0, samples, typical)]
        return [{k: v[i:i + batch] if k in rows else v for k, v in d.items()}
                for n, d in zip(range(0, samples, typical), draws) for i in range(0, min(typical, samples - n), batch)]
    inputs, _ = load_split(spec, "train")  # checked as training checks it: values in range, finite, some rows
    available = len(next(iter(inputs.values())))
    chosen = rng.choice(available, size=min(samples, available), replace=False)
    return [_typed(spec, {k: v[chosen[i:i + batch]] for k, v in inputs.items()})
            for i in range(0, len(chosen), batch)]


def calibration_rows(spec: ModelSpec, samples: int = DEFAULT_SAMPLES) -> int:
    """How many inputs `calibration_batches(spec, samples)` gives: `samples`, or the whole
    training split where it is smaller (what a manifest records as calibrated on)."""
    if spec.dataset is None:
        return samples
    _, targets = spec.dataset.load("train")
    return min(samples, len(targets))


def _typed(spec: ModelSpec, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Contiguous arrays of the dtypes the signature names, in spec order."""
    return {t.name: np.ascontiguousarray(inputs[t.name], dtype=_NUMPY.get(t.dtype, t.dtype)) for t in spec.inputs}
