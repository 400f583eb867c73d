"""What the vision plugins' pixel bound (zoo_vision.images.MAX_PIXELS) saves per request item.

A PNG of 8,000 x 8,000 black pixels compresses to about 62 KB, below Pillow's own
decompression-bomb limit (about 89 megapixels). Each run decodes it once, in a fresh
process, either as `decode` did before the bound (load every pixel, convert to RGB) or
through `decode` now (the size is read from the header and refused), and prints the
seconds and the growth of the process's peak memory.

    .venv/bin/python tools/image_bound.py [--runs 3]
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import io, resource, sys, time
from PIL import Image
from zoo.errors import InputError
from zoo_vision.images import decode
data = open(sys.argv[2], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if sys.argv[1] == "decoded":
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        image.convert("RGB")
else:
    try:
        decode(data, 1, "RGB")
        raise SystemExit("not refused")
    except InputError:
        pass
seconds = time.perf_counter() - start
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(f"{sys.argv[1]:8} {seconds * 1e3:8.1f} ms  peak memory +{grown:.0f} MB")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.png"
        buffer = io.BytesIO()
        Image.new("L", (8000, 8000)).save(buffer, "PNG", optimize=True)
        path.write_bytes(buffer.getvalue())
        print(f"8000 x 8000 PNG: {path.stat().st_size / 1e3:.0f} KB")
        for _ in range(args.runs):  # alternating, so that both see the same machine
            for how in ("decoded", "refused"):
                subprocess.run([sys.executable, "-c", CHILD, how, str(path)], check=True)


if __name__ == "__main__":
    main()
