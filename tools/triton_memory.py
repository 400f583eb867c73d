"""What a real Triton server holds, idle, per Python stub: the basis of `zoo deploy kserve`'s memory.

    .venv/bin/python tools/triton_memory.py [--repository DIR] [--rounds 3] [--idle 5] [--json FILE]

Starts `tritonserver` (tools/tritonserver.py, `make triton`) on a repository of
random-init exports, waits until no model is loading, lets it sit `--idle` seconds and
reads, from /proc, the resident memory of tritonserver itself and of each Python-backend
stub (a child of tritonserver running `MODEL/1/model.py`, with any processes of its own):

- **RSS**: every page the process maps, shared ones (libraries) included in full;
- **PSS** (`/proc/PID/smaps_rollup`): shared pages divided among the processes mapping
  them, which on a shared machine include unrelated processes mapping the same libtorch;
- **anon**: its anonymous memory (heap, the imported modules' objects, the model), which no
  other process shares: stubs are started by fork+exec, so there is no copy-on-write. What
  RSS holds above it is file-backed (libraries), mapped once per container whatever the
  number of stubs that map it;
- **peak RSS** (`VmHWM`): the most it held, while loading (torch reads a program in).

Without `--repository` the repository is exported into a temporary directory first with
the `zoo` CLI (`EXPORTS`): resnet8.digits through ONNX Runtime, OpenVINO (both `--triton
python`), torch, torch-compile and torch-aoti (python form, their default), mpnn.freesolv
and minilm-l6.all-v2 (86 MiB of weights: what a larger model adds) through ONNX Runtime
(`--triton python`), minilm-l6.all-v2 through torch, and ppo.cartpole through ONNX Runtime in the
native form, which this Triton build (Python backend only) leaves UNAVAILABLE.

Prints one row per process and round, then per stub the largest figures over the rounds,
from which `zoo.deploy` takes its constants (docs/deploy.md, "Memory"). Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from tritonserver import Tritonserver, unavailable_reason  # noqa: E402

#: (model, backend, Triton form or None for the backend's default)
EXPORTS = [
    ("resnet8.digits", "onnxruntime", "python"),
    ("resnet8.digits", "openvino", "python"),
    ("resnet8.digits", "torch", None),
    ("resnet8.digits", "torch-compile", None),
    ("resnet8.digits", "torch-aoti", None),
    ("mpnn.freesolv", "onnxruntime", "python"),
    ("minilm-l6.all-v2", "onnxruntime", "python"),  # 86 MiB of weights: what a larger model adds
    ("minilm-l6.all-v2", "torch", None),
    ("ppo.cartpole", "onnxruntime", None),  # native: onnxruntime_onnx, no such backend in this build
]
MIB = 1024 * 1024


def export(repository: Path) -> None:
    zoo = [sys.executable, "-m", "zoo"]
    for model, backend, form in EXPORTS:
        cmd = [*zoo, "export", model, "-b", backend, "--random-init", "-r", str(repository)]
        if form:
            cmd += ["--triton", form]
        print("$", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def tree(pid: int) -> list[int]:
    return [pid, *(p for child in children(pid) for p in tree(child))]


def memory(pids: list[int]) -> dict[str, float]:
    """RSS, PSS, anonymous memory and peak RSS (VmHWM) of `pids` together, MiB (PSS None where
    unreadable)."""
    total = {"rss": 0.0, "pss": 0.0, "anon": 0.0, "peak": 0.0}
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total["peak"] += int(line.split()[1]) / 1024
        try:
            fields = {}
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
        except (OSError, ValueError):
            total["pss"] = None  # type: ignore[assignment]
            status = Path(f"/proc/{pid}/status").read_text()
            fields = {("Rss" if k == "VmRSS" else "Anonymous"): int(v.split()[0]) * 1024
                      for k, v in (line.split(":", 1) for line in status.splitlines())
                      if k in ("VmRSS", "RssAnon")}
        total["rss"] += fields["Rss"] / MIB
        total["anon"] += fields["Anonymous"] / MIB
        if total["pss"] is not None:
            total["pss"] += fields["Pss"] / MIB
    return total


def files_mib(artifact: Path) -> float:
    """The artifact's files as its manifest lists them."""
    manifest = json.loads((artifact / "zoo.json").read_text())
    return sum((artifact / rel).stat().st_size for rel in manifest["files"]) / MIB


def measure(repository: Path, idle: float, log: Path) -> dict:
    with Tritonserver(repository, log=log) as triton:
        time.sleep(idle)
        index = triton.index()
        server = memory([triton.proc.pid])
        stubs = {}
        for pid in children(triton.proc.pid):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if len(argv) > 1 and argv[1].endswith(b"/1/model.py"):
                stubs[Path(argv[1].decode()).parent.parent.name] = {"pids": len(tree(pid)), **memory(tree(pid))}
        whole = memory(tree(triton.proc.pid))
    models = {}
    for path in sorted(p for p in repository.iterdir() if (p / "zoo.json").is_file()):
        manifest = json.loads((path / "zoo.json").read_text())
        models[path.name] = {"backend": manifest["backend"]["name"],
                             "form": (manifest.get("triton") or {}).get("form", "native"),
                             "state": index.get(path.name, {}).get("state"),
                             "reason": index.get(path.name, {}).get("reason", ""),
                             "files_mib": files_mib(path), "stub": stubs.get(path.name)}
    return {"server": server, "whole": whole, "models": models}


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repository", type=Path, help="measure this repository (default: export EXPORTS "
                        "into a temporary one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds after loading before reading memory")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    ns = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        sys.exit(f"error: {reason}")
    with tempfile.TemporaryDirectory(prefix="triton-memory-") as tmp:
        repository = ns.repository
        if repository is None:
            repository = Path(tmp) / "models"
            export(repository)
        repository = repository.resolve()
        rounds = []
        for r in range(ns.rounds):
            log = Path(tmp) / f"triton-{r}.log"
            rounds.append(measure(repository, ns.idle, log))
            print(f"round {r + 1}: server RSS {fmt(rounds[-1]['server']['rss'])} MiB, "
                  f"everything {fmt(rounds[-1]['whole']['pss'])} MiB PSS", flush=True)
    keys = ("rss", "pss", "anon", "peak")
    print("\n| round | process | backend | form | state | RSS MiB | PSS MiB | anon MiB | peak RSS MiB | files MiB |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for r, result in enumerate(rounds, 1):
        print(f"| {r} | tritonserver | | | | {' | '.join(fmt(result['server'][k]) for k in keys)} | |")
        for name, m in result["models"].items():
            stub = m["stub"] or {}
            state = m["state"] if m["state"] == "READY" else f"{m['state']}: {m['reason'][:60]}"
            print(f"| {r} | {name} stub | {m['backend']} | {m['form']} | {state} | "
                  f"{' | '.join(fmt(stub.get(k)) for k in keys)} | {m['files_mib']:.2f} |")
    print(f"\nLargest over {len(rounds)} rounds, MiB: RSS / PSS / anon / peak RSS; libraries = RSS - anon")
    print(f"  tritonserver: {' / '.join(fmt(max(r['server'][k] or 0 for r in rounds)) for k in keys)}")
    for name, m in rounds[0]["models"].items():
        stubs = [r["models"][name]["stub"] for r in rounds if r["models"][name]["stub"]]
        if stubs:
            print(f"  {name} stub ({m['backend']}, files {m['files_mib']:.2f}): "
                  f"{' / '.join(fmt(max(s[k] or 0 for s in stubs)) for k in keys)}; "
                  f"libraries {fmt(max(s['rss'] - s['anon'] for s in stubs))}")
    print(f"  everything (server and stubs): {' / '.join(fmt(max(r['whole'][k] or 0 for r in rounds)) for k in keys)}")
    if ns.json:
        ns.json.write_text(json.dumps({"repository": str(repository), "idle_s": ns.idle, "rounds": rounds},
                                      indent=1))


if __name__ == "__main__":
    main()
