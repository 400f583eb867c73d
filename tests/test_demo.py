"""`zoo demo`, the README's first command: train resnet8.digits, export it to the backends
that run here without compiling native code, verify each, benchmark them."""

from __future__ import annotations

import pytest

from zoo import registry
from zoo.demo import MODEL, choose, run
from zoo.errors import UnknownBackendError


def test_the_default_leaves_compiling_backends_to_an_option():
    chosen, skipped = choose()
    runs_here = {n for n, b in registry.backends().items() if b.probe("cpu").ok and "fp32" in b.precisions.get("cpu", ())}
    assert {"torch", "onnxruntime"} <= set(chosen)
    assert set(chosen) == {n for n in runs_here if not registry.get_backend(n).compiles}
    compiling = sorted(n for n in runs_here if registry.get_backend(n).compiles)
    assert {"torch-compile", "torch-aoti"} <= set(compiling)
    assert [line for line in skipped if "--backends all" in line] == [
        f"skipping backend {n}: its export compiles native code for a minute or more; `zoo demo --backends all` "
        f"includes it" for n in sorted(registry.backends()) if n in compiling]
    assert set(choose(["all"])[0]) == runs_here
    assert choose(["onnxruntime"])[0] == ["onnxruntime"]
    with pytest.raises(UnknownBackendError, match="unknown backend 'onnx'"):
        choose(["onnx"])


@pytest.mark.slow
def test_demo_trains_to_its_target_and_every_artifact_matches_pytorch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the demo writes checkpoints/ and exports/ where it runs
    report = run(tmp_path / "exports", min_time=0.05, batch_sizes=(1,), only=["torch", "onnxruntime"])
    rows = report["results"]
    assert sorted((r["backend"], r["batch"], r["status"]) for r in rows) == [("onnxruntime", 1, "ok"), ("torch", 1, "ok")]
    target = registry.get_model(MODEL).recipe.target
    for r in rows:
        assert r["metric_reference"] >= target, f"trained to {r['metric_reference']:.4f}, under the recipe's {target}"
        assert abs(r["metric_delta"]) < 1e-3 and r["max_abs_error"] < 1e-4
