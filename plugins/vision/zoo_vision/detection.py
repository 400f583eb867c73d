"""`centernet.shapes`: a real-time object detector trained here on generated scenes.

The spec's outputs are finished detections (decoding and peak suppression are in the
graph, see centernet.py) plus the raw head maps the loss is computed from.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from zoo import AxisRange, Dataset, Metric, ModelSpec, Recipe, TensorSpec, Tolerance

from . import images, shapes
from .mean_ap import mean_average_precision

#: the heads' output stride: their resolution is a quarter of the input's, as in the paper
STRIDE = 4

#: a detection is reported by `zoo predict` when its score reaches this.
SCORE_THRESHOLD = 0.3

#: boxes are in pixels (up to the image size) and scores in [0, 1]: fp32 backends agree to
#: ~1e-5 pixels. Below fp32 two near-tied peaks may swap slots, and then a "box" moves by
#: the distance between two objects: rounding only the trained model's head maps to fp16
#: moved one by 54.8 px (batch 32, seed 1). So at fp16, bf16 and int8 the decoded boxes,
#: scores and classes are held by mAP@0.5, not elementwise, while the raw head maps they
#: are decoded from are still compared elementwise: tightly at fp16, loosely at int8
#: (static Q/DQ moves them by ~1 of ~25; mAP measured -0.002).
DETECTOR_TOLERANCES = {
    "fp32": Tolerance(1e-3, 1e-4),
    "fp16": Tolerance(2e-1, 2e-2, metric_drop=0.01, compare=("heads",)),
    "bf16": Tolerance(1.0, 5e-2, metric_drop=0.02, compare=("heads",)),
    "int8": Tolerance(2.0, 0.1, metric_drop=0.02, compare=("heads",)),
}


def map50(outputs, targets) -> float:
    """mAP at IoU 0.5 over the split (PASCAL VOC's metric)."""
    return mean_average_precision(outputs["boxes"], outputs["scores"], outputs["classes"], targets, 0.5)[0]


def loss(num_classes: int, image_size: int, outputs, targets):
    from .centernet import centernet_loss  # torch: imported by training, not by registering the model

    return centernet_loss(outputs["heads"], targets, num_classes, image_size)


def build(*args):
    from .centernet import CenterNet

    return CenterNet(*args)


def load(image_size: int, train_scenes: int, test_scenes: int, split: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    scenes, targets = shapes.split(split, image_size, train_scenes if split == "train" else test_scenes)
    return {"image": scenes}, targets


def sample(image_size: int, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fresh scenes from seeds outside both splits: what a deployed detector would see."""
    seeds = rng.integers(2 * shapes.TEST_SEED, 3 * shapes.TEST_SEED, size=batch)
    return {"image": shapes.scenes(seeds, image_size)[0]}


def centernet_shapes(width: int = 32, image_size: int = 64, max_detections: int = 20,
                     train_scenes: int = 4000, test_scenes: int = 500) -> ModelSpec:
    num_classes = len(shapes.CLASSES)
    cells = image_size // STRIDE
    return ModelSpec(
        name="centernet.shapes",
        domain="vision",
        task="object-detection",
        description=f"CenterNet ('Objects as Points'), width {width}, on generated {image_size}x{image_size} "
                    f"scenes of {', '.join(shapes.CLASSES)}; decoding and peak NMS in the graph",
        inputs=(TensorSpec("image", "float32", ("batch", 3, image_size, image_size)),),
        outputs=(TensorSpec("boxes", "float32", ("batch", max_detections, 4)),
                 TensorSpec("scores", "float32", ("batch", max_detections)),
                 TensorSpec("classes", "int64", ("batch", max_detections)),
                 TensorSpec("heads", "float32", ("batch", num_classes + 4, cells, cells))),
        axes={"batch": AxisRange(1, 8, 32)},
        build=partial(build, num_classes, width, image_size, max_detections),
        sample=partial(sample, image_size),
        config={"width": width, "image_size": image_size, "max_detections": max_detections,
                "train_scenes": train_scenes, "test_scenes": test_scenes},
        tiny_config={"width": 8, "image_size": 32, "max_detections": 8, "train_scenes": 64, "test_scenes": 32},
        variant=centernet_shapes,
        dataset=Dataset(f"generated shapes: {train_scenes} train / {test_scenes} test scenes of up to "
                        f"{shapes.MAX_OBJECTS} occluding shapes on cluttered backgrounds (seeded, never downloaded)",
                        partial(load, image_size, train_scenes, test_scenes)),
        loss=partial(loss, num_classes, image_size),
        metric=Metric("map50", map50, higher_is_better=True),
        # channels-last in fp32 too: 1.08-1.15x the samples/s of row-major on CPU (docs/benchmarks.md)
        recipe=Recipe(epochs=20, batch_size=32, lr=4e-3, weight_decay=1e-4, optimizer="adamw",
                      schedule="onecycle", seed=0, target=0.9, quality_seeds=1, channels_last=True),
        tolerances=DETECTOR_TOLERANCES,
        quantization="static",  # a CNN: int8 convolutions end to end
        raw_kind="image", raw_binary=True,
        preprocess=partial(images.rgb_batch, size=image_size),
        postprocess=partial(images.detections, classes=shapes.CLASSES, image_size=image_size,
                            threshold=SCORE_THRESHOLD),
    )
