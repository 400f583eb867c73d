"""Which AOTInductor settings make a CUDA package that its loader can load, on this GPU.

On the first GPU run (2026-11-26, H200, torch 2.11.0+cu130) AOTInductor's loader crashed
the process (SIGSEGV in `AOTIModelPackageLoader`) loading a package it had just built from
a two-layer MLP with the `torch-aoti` backend's settings (`freezing` and the options of
mode "max-autotune-no-cudagraphs"). This builds the same MLP with those settings and with
each one left out, loads every package in a child process (so a crash is that child's),
runs it once there against eager PyTorch, and prints one row per variant: which setting is
the trigger, to be fixed in `zoo_torch.aoti.inductor_configs`. GPU only; about two minutes.

    python tools/aoti_cuda_probe.py [OUT.json]
    ZOO_PROBE_DEVICE=cpu python tools/aoti_cuda_probe.py   # the probe's own dry run, on a CPU

The second GPU run (2026-11-30, H200, torch 2.11.0+cu130) reproduced the crash with zoo's
settings at both device indexes; the builds took 43 s each and the loads long enough that the
call ended before the other variants, hence the quick variants first now and `load_s`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

#: runs in the child: load the package, run it once, compare with the eager module's outputs
CHILD = """
import sys, torch
package = torch._inductor.aoti_load_package(sys.argv[1], device_index=int(sys.argv[2]))
x, want = torch.load(sys.argv[3])
got = package(x.to(sys.argv[4]))
got = got[0] if isinstance(got, (list, tuple)) else got
print(float((got.cpu() - want).abs().max()))
"""


def variants() -> dict[str, dict]:
    autotune = torch._inductor.list_mode_options("max-autotune-no-cudagraphs")
    variants = {  # the quick builds first: a short call should learn the most
        "neither": {},
        "without max-autotune": {"freezing": True},
        "without freezing": dict(autotune),
        "zoo's settings (freezing, max-autotune)": {"freezing": True, **autotune},
    }
    only = os.environ.get("ZOO_PROBE_VARIANTS")  # "neither,without freezing": some of them
    return {k: v for k, v in variants.items() if not only or k in only.split(",")}


def main() -> int:
    device = os.environ.get("ZOO_PROBE_DEVICE", "cuda")
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to probe", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).eval().to(device)
    example = torch.randn(4, 4, device=device)
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    work = Path(tempfile.mkdtemp(prefix="aoti-probe-"))
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.save((x, module(x.to(device)).cpu()), work / "io.pt")
    rows = []
    for name, configs in variants().items():
        path = work / f"{len(rows)}.pt2"
        start = time.perf_counter()
        try:  # one build per variant, loaded with both device indexes
            torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)
        except Exception as exc:  # noqa: BLE001 - a row of the table
            rows.append({"variant": name, "configs": sorted(configs),
                         "result": f"build failed: {type(exc).__name__}: {exc}"[:300]})
            print(f"{name:42} {rows[-1]['result']}", flush=True)
            continue
        build_s = round(time.perf_counter() - start, 1)
        for index in (-1, 0):
            row = {"variant": name, "device_index": index, "configs": sorted(configs), "build_s": build_s}
            start = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(index), str(work / "io.pt"), device],
                                 capture_output=True, text=True, timeout=120, check=False)
            row["load_s"] = round(time.perf_counter() - start, 1)
            if out.returncode < 0:
                row["result"] = f"loader crashed: {signal.Signals(-out.returncode).name}"
            elif out.returncode:
                row["result"] = "failed: " + (out.stderr.strip().splitlines() or ["?"])[-1][:300]
            else:
                row["result"] = f"ran, max |err| {float(out.stdout.split()[-1]):.2e}"
            rows.append(row)
            print(f"{name:42} device_index={index:2} build {build_s:5.1f} s load {row['load_s']:5.1f} s  {row['result']}",
                  flush=True)
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    report = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu, "rows": rows}
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
