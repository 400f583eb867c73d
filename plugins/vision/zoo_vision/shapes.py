"""Procedurally generated detection scenes: coloured shapes on cluttered backgrounds.

Every scene is drawn from its own seed, so a split is a range of seeds and any machine
makes exactly the same images and boxes; nothing is downloaded. What makes the task
more than template matching:

- five classes whose silhouettes differ (a filled circle and a ring share a bounding box
  and a colour range, so the detector has to look inside the shape);
- sizes from small to a third of the image, random colours that only need to stand out
  from the local background;
- a colour gradient with low-frequency texture, thin line and dot clutter;
- partial occlusion: later shapes are drawn over earlier ones, up to 35% of the smaller
  box may be covered, never the whole object;
- Gaussian pixel noise.

Boxes are the full (amodal) extent of each shape, as COCO annotates occluded objects,
in pixels with (0, 0) the top-left corner of the image: [x1, y1, x2, y2].
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

CLASSES = ("circle", "square", "triangle", "cross", "ring")
#: at most this many objects per scene; targets are padded to this many rows.
MAX_OBJECTS = 6
#: largest fraction of the smaller of two boxes that another may cover.
MAX_OVERLAP = 0.35
#: seeds of the test split start here, far from the train split's.
TEST_SEED = 1_000_000


def _mask(kind: str, gx: np.ndarray, gy: np.ndarray, r: float) -> np.ndarray:
    """Pixels (at offsets gx, gy from the centre) covered by a shape of half-size r."""
    ax, ay = np.abs(gx), np.abs(gy)
    if kind == "circle":
        return gx**2 + gy**2 <= r**2
    if kind == "square":
        return (ax <= r) & (ay <= r)
    if kind == "triangle":  # apex at the top centre, base along the bottom edge
        height = (gy + r) / (2 * r)  # 0 at the apex, 1 at the base
        return (gy >= -r) & (gy <= r) & (ax <= r * height)
    if kind == "cross":
        arm = r / 3
        return ((ax <= r) & (ay <= arm)) | ((ax <= arm) & (ay <= r))
    if kind == "ring":
        d2 = gx**2 + gy**2
        return (d2 <= r**2) & (d2 >= (0.55 * r) ** 2)
    raise ValueError(f"unknown shape {kind!r}")


def _background(rng: np.random.Generator, size: int, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    """A muted two-colour gradient with low-frequency texture, lines and dots."""
    c0, c1 = rng.uniform(0.1, 0.7, (2, 3))
    angle = rng.uniform(0, 2 * np.pi)
    t = ((xx * np.cos(angle) + yy * np.sin(angle)) / size + 1) / 2
    image = c0[:, None, None] * (1 - t) + c1[:, None, None] * t
    coarse = rng.normal(0, 0.08, (3, 5, 5))  # texture: a 5x5 field, upsampled
    idx = np.linspace(0, 4, size)
    lo = np.floor(idx).astype(int).clip(0, 3)
    frac = idx - lo
    rows = coarse[:, lo] * (1 - frac)[None, :, None] + coarse[:, lo + 1] * frac[None, :, None]
    image = image + rows[:, :, lo] * (1 - frac) + rows[:, :, lo + 1] * frac
    for _ in range(rng.integers(2, 7)):  # clutter: thin segments in random colours
        x0, y0, x1, y1 = rng.uniform(0, size, 4)
        steps = np.linspace(0, 1, 2 * size)
        px = np.clip((x0 + (x1 - x0) * steps).astype(int), 0, size - 1)
        py = np.clip((y0 + (y1 - y0) * steps).astype(int), 0, size - 1)
        image[:, py, px] = rng.uniform(0, 1, 3)[:, None]
    for _ in range(rng.integers(2, 7)):  # clutter: dots too small to be a shape
        cx, cy = rng.uniform(0, size, 2)
        image[:, (xx - cx) ** 2 + (yy - cy) ** 2 <= rng.uniform(0.5, 2.0) ** 2] = rng.uniform(0, 1, 3)[:, None]
    return image


def _overlaps(box: np.ndarray, boxes: list[np.ndarray]) -> bool:
    for other in boxes:
        iw = min(box[2], other[2]) - max(box[0], other[0])
        ih = min(box[3], other[3]) - max(box[1], other[1])
        if iw > 0 and ih > 0:
            smaller = min((box[2] - box[0]) * (box[3] - box[1]), (other[2] - other[0]) * (other[3] - other[1]))
            if iw * ih / smaller > MAX_OVERLAP:
                return True
    return False


def scene(seed: int, size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """One scene: a float32 (3, size, size) image in [0, 1] and a float32
    (MAX_OBJECTS, 5) array of [class, x1, y1, x2, y2] rows, padded with class -1."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] + 0.5  # pixel centres
    image = _background(rng, size, yy, xx)
    boxes: list[np.ndarray] = []
    labels: list[int] = []
    for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
        for _attempt in range(20):
            r = rng.uniform(0.08, 0.2) * size  # half-size: boxes from 16% to 40% of the image
            cx, cy = rng.uniform(r, size - r, 2)
            box = np.array([cx - r, cy - r, cx + r, cy + r])
            if not _overlaps(box, boxes):
                break
        else:
            continue  # no room left: fewer objects in this scene
        kind = int(rng.integers(len(CLASSES)))
        local = image[:, int(cy), int(cx)]
        colour = rng.uniform(0, 1, 3)
        while np.abs(colour - local).max() < 0.35:  # stand out from the background under it
            colour = rng.uniform(0, 1, 3)
        image[:, _mask(CLASSES[kind], xx - cx, yy - cy, r)] = colour[:, None]
        boxes.append(box)
        labels.append(kind)
    image = image + rng.normal(0, rng.uniform(0.01, 0.05), image.shape)
    targets = np.full((MAX_OBJECTS, 5), -1.0, dtype=np.float32)
    targets[:, 1:] = 0.0
    for i, (kind, box) in enumerate(zip(labels, boxes)):
        targets[i] = (kind, *box)
    return np.clip(image, 0, 1).astype(np.float32), targets


def scenes(seeds, size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Scenes for each seed, stacked: images (n, 3, size, size), targets (n, MAX_OBJECTS, 5)."""
    pairs = [scene(int(s), size) for s in seeds]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


@lru_cache(maxsize=4)
def split(name: str, size: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The train split is seeds 0..count-1, the test split TEST_SEED onwards: disjoint."""
    if name not in ("train", "test"):
        raise ValueError(f"shapes has splits train and test, not {name!r}")
    start = 0 if name == "train" else TEST_SEED
    return scenes(range(start, start + count), size)
