"""The ONNX cache (`zoo_onnx.cache`): a module exported before is copied, not translated
again; anything that changes the graph misses; a damaged entry is never used."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import zoo
from zoo.errors import ExportError
from zoo_onnx import cache, export
from zoo_onnx.export import export_onnx


class Mlp(torch.nn.Module):
    def __init__(self, act=torch.nn.functional.relu):
        super().__init__()
        self.first, self.second, self.act = torch.nn.Linear(6, 5), torch.nn.Linear(5, 3), act

    def forward(self, x):
        return self.second(self.act(self.first(x)))


class GeluMlp(Mlp):
    """The same weights as `Mlp`, another computation."""

    def forward(self, x):
        return self.second(torch.nn.functional.gelu(self.first(x)))


SPEC = zoo.ModelSpec(name="mlp.cache-test", domain="test", task="test",
                     inputs=(zoo.TensorSpec("x", "float32", ("batch", 6)),),
                     outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),), build=Mlp,
                     sample=lambda n, rng: {"x": rng.standard_normal((n, 6)).astype(np.float32)})
EXAMPLE = {"x": torch.randn(4, 6)}


def _module(cls=Mlp):
    torch.manual_seed(0)
    return cls().eval()


@pytest.fixture
def exports(tmp_path, monkeypatch):
    """`export_onnx` into a cache of the test's own, with the calls that reach torch's
    exporter counted."""
    monkeypatch.setenv("ZOO_ONNX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ZOO_ONNX_CACHE", raising=False)
    translated = []
    real = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: translated.append(a[0]) or real(*a, **k))
    count = iter(range(1000))

    def export(module, spec=SPEC):
        path = tmp_path / f"{next(count)}.onnx"
        info = export_onnx(module, spec, EXAMPLE, path)
        return info, path

    export.translated = translated
    return export


def test_a_second_export_is_copied_and_is_the_same_graph(exports, tmp_path):
    info, first = exports(_module())
    assert info["onnx_cache"] == "miss" and len(exports.translated) == 1
    assert isinstance(exports.translated[0], torch.export.ExportedProgram)  # the captured program: the key
    info, again = exports(_module())  # a new module object, the same weights and code
    assert info == {"exporter": "dynamo", "onnx_cache": "hit", "opset": 18}
    assert len(exports.translated) == 1  # torch's exporter was not called again
    assert again.read_bytes() == first.read_bytes()
    x = np.random.default_rng(1).standard_normal((7, 6)).astype(np.float32)  # a batch never traced
    y, = ort.InferenceSession(str(again), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, _module()(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".json", ".onnx"]


def test_whatever_changes_the_graph_misses(exports):
    exports(_module())
    changed = _module()
    with torch.no_grad():
        changed.second.bias[0] += 1
    renamed = dataclasses.replace(SPEC, outputs=(zoo.TensorSpec("z", "float32", ("batch", 3)),))
    narrower = dataclasses.replace(SPEC, axes={**SPEC.axes, "batch": dataclasses.replace(SPEC.axes["batch"], max=16)})
    for module, spec in [(changed, SPEC), (_module(GeluMlp), SPEC), (_module(), renamed), (_module(), narrower)]:
        info, path = exports(module, spec)
        assert info["onnx_cache"] == "miss", (type(module).__name__, spec)
        graph = onnx.load(str(path)).graph
        assert [o.name for o in graph.output] == [t.name for t in spec.outputs]
    assert len(exports.translated) == 5
    assert len(list(cache.cache_dir().glob("*.onnx"))) == 5


def test_a_damaged_entry_is_removed_and_the_export_runs(exports, caplog):
    _, first = exports(_module())
    entry, = cache.cache_dir().glob("*.onnx")
    entry.write_bytes(entry.read_bytes()[:-10] + b"0123456789")  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger="zoo_onnx.cache"):
        info, again = exports(_module())
    assert info["onnx_cache"] == "miss" and len(exports.translated) == 2
    assert "is damaged" in caplog.text
    assert entry.read_bytes() == first.read_bytes() == again.read_bytes()  # stored again, whole


def test_off_and_bounded(exports, monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_ONNX_CACHE", "0")
    assert exports(_module())[0]["onnx_cache"] == "off"
    assert not (tmp_path / "cache").exists()
    monkeypatch.delenv("ZOO_ONNX_CACHE")
    sizes = [exports(_module(cls))[1].stat().st_size for cls in (Mlp, GeluMlp)]
    cache.clear()
    monkeypatch.setenv("ZOO_ONNX_CACHE_MB", str(1.5 * max(sizes) / (1 << 20)))  # room for one entry, not two
    exports(_module())
    exports(_module(GeluMlp))
    assert len(list(cache.cache_dir().glob("*.onnx"))) == 1
    assert exports(_module(GeluMlp))[0]["onnx_cache"] == "hit"  # the newer stayed
    assert exports(_module())[0]["onnx_cache"] == "miss"  # the older went


def test_a_cache_that_cannot_be_written_is_not_an_export_error(exports, tmp_path, monkeypatch, caplog):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache's directory would be")
    monkeypatch.setenv("ZOO_ONNX_CACHE_DIR", str(blocked / "onnx"))
    with caplog.at_level(logging.WARNING, logger="zoo_onnx.cache"):
        info, path = exports(_module())
    assert info["onnx_cache"] == "miss" and onnx.load(str(path)).graph.output[0].name == "y"
    assert "could not store the ONNX graph" in caplog.text


def test_another_process_finds_the_entry(tmp_path):
    """The key is the program, not anything of one process: a second interpreter exporting
    a built-in model hits the entry the first stored."""
    script = textwrap.dedent("""
        import sys, numpy as np, torch, zoo
        from zoo.tensors import to_torch
        from zoo_onnx.export import export_onnx
        spec = zoo.get_model("resnet8.digits").tiny()
        torch.manual_seed(0)
        info = export_onnx(spec.build().eval(), spec, to_torch(spec.sample(4, np.random.default_rng(0)), spec),
                           sys.argv[1])
        print(info["onnx_cache"])
    """)
    env = {k: v for k, v in os.environ.items() if k != "ZOO_ONNX_CACHE"}
    env["ZOO_ONNX_CACHE_DIR"] = str(tmp_path / "cache")
    outcomes = [subprocess.run([sys.executable, "-c", script, str(tmp_path / f"{i}.onnx")], env=env, check=True,
                               capture_output=True, text=True).stdout.split()[-1] for i in range(2)]
    assert outcomes == ["miss", "hit"]
    first, second = (onnx.load(str(tmp_path / f"{i}.onnx")) for i in range(2))
    assert [n.op_type for n in first.graph.node] == [n.op_type for n in second.graph.node]


def test_a_program_the_key_cannot_describe_is_exported_uncached(exports, monkeypatch):
    """A weight whose bytes cannot be read as such (a layout the key does not know) leaves
    the export as it is without a cache: the dynamo exporter's graph, not a fallback."""
    def unreadable(tensor):
        raise TypeError(f"cannot view a {tensor.layout} tensor as bytes")

    monkeypatch.setattr(cache, "_tensor_bytes", unreadable)
    info, path = exports(_module())
    assert (info["exporter"], info["onnx_cache"]) == ("dynamo", "off")
    assert len(exports.translated) == 1 and onnx.load(str(path)).graph.output[0].name == "y"
    assert not cache.cache_dir().exists()


def test_an_invalid_graph_is_an_export_error_and_never_cached(exports, monkeypatch):
    """An output named as a value inside ("linear": the first Linear's) is renamed apart
    before the file is written; were a graph still invalid (here: that renaming skipped),
    the export fails with the checker's reason, and neither the file nor an entry stays."""
    linear = dataclasses.replace(SPEC, outputs=(zoo.TensorSpec("linear", "float32", ("batch", 3)),))
    info, path = exports(_module(), linear)
    assert info["onnx_cache"] == "miss" and onnx.load(str(path)).graph.output[0].name == "linear"
    onnx.checker.check_model(str(path))
    cache.clear()
    monkeypatch.setattr(export, "_unique_names", lambda model: None)
    with pytest.raises(ExportError, match=r"could not export mlp.cache-test to ONNX: the graph written is not valid "
                                          r"ONNX \(.*'linear' has been used as output names multiple times"):
        exports(_module(), linear)
    assert not list(cache.cache_dir().glob("*.onnx"))
    assert sorted(p.name for p in path.parent.glob("*.onnx")) == [path.name]  # the failed one's file is gone
