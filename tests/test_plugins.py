"""Plugins tested as users write them (the `llm` tool's tests/test_plugins.py style).

A plugin is a class defined inside the test, registered with
`zoo.registry.register_plugin` in a yield fixture and unregistered after it, so every
test leaves the registry as it found it. Local plugin files (`--plugin FILE`,
`ZOO_PLUGINS`) are loaded by the CLI in a subprocess, where they cannot leak into this
process. The last test, after datasette's, fails when a hook is not documented.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
from zoo import hookspecs, registry
from zoo.errors import PluginError, UnknownModelError, ZooError
from zoo.arrays import to_numpy
from zoo.tensors import call_module, to_torch

from cli_support import zoo_cli

README = Path(__file__).resolve().parents[1] / "README.md"
HOOKS = sorted(name for name, obj in vars(hookspecs).items() if hasattr(obj, "zoo_spec"))


def mlp_spec(name: str = "mlp.toy", hidden: int = 8) -> zoo.ModelSpec:
    """A small MLP classifier over 4 features, configurable by its hidden width."""
    return zoo.ModelSpec(
        name=name, domain="tabular", task="classification",
        inputs=(zoo.TensorSpec("features", "float32", ("batch", 4)),),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 3)),),
        build=lambda: torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3)),
        sample=lambda batch, rng: {"features": rng.standard_normal((batch, 4)).astype(np.float32)},
        config={"hidden": hidden}, variant=partial(mlp_spec, name))


class ToyRunner:
    def __init__(self, module: torch.nn.Module, spec: zoo.ModelSpec) -> None:
        self.module, self.spec = module, spec
        self.input_names = tuple(t.name for t in spec.inputs)
        self.output_names = tuple(t.name for t in spec.outputs)

    @torch.no_grad()
    def __call__(self, inputs):
        return to_numpy(call_module(self.module, self.spec, to_torch(inputs, self.spec)))


class ToyBackend(zoo.Backend):
    """The smallest real backend: the spec's own module, its weights in a safetensors file."""

    name = "toy-eager"
    description = "the spec's PyTorch module, weights in safetensors"
    precisions = {"cpu": ("fp32",)}
    filename = "model.safetensors"
    triton = {"backend": "python"}

    def versions(self):
        return {"torch": torch.__version__}

    def probe(self, device):
        return zoo.Availability(device == "cpu", "" if device == "cpu" else "the toy backend runs on the CPU only")

    def export(self, module, spec, example, path, precision, device):
        save_file({k: v.detach().contiguous() for k, v in module.state_dict().items()}, str(path))
        return {"format": "safetensors"}

    def load(self, path, spec, precision, device, threads=None, info=None):
        module = spec.build()
        module.load_state_dict(load_file(str(path)))
        return ToyRunner(module.eval(), spec)


@pytest.fixture
def register():
    """`register(plugin, name)` as a user calls it; every plugin is unregistered after
    the test, including one whose registration raised."""
    plugins = []

    def register_(plugin: object, name: str) -> None:
        plugins.append(plugin)
        registry.register_plugin(plugin, name=name)

    yield register_
    for plugin in plugins:
        if registry.pm.is_registered(plugin):
            registry.unregister_plugin(plugin)


@pytest.fixture
def toy_plugin(register):
    class ToyPlugin:
        @zoo.hookimpl
        def zoo_register_models(self, register):
            register(mlp_spec())

        @zoo.hookimpl
        def zoo_register_backends(self, register):
            register(ToyBackend())

    plugin = ToyPlugin()
    register(plugin, name="toy-plugin")
    return plugin


# ---------------------------------------------------------------- registering


def test_plugin_model_is_listed_and_built(toy_plugin):
    assert "mlp.toy" in zoo.list_models()
    spec = zoo.get_model("mlp.toy")
    assert spec.plugin == "toy-plugin"
    module = spec.build().eval()
    inputs = to_torch(spec.sample(2, np.random.default_rng(0)), spec)
    assert call_module(module, spec, inputs)["logits"].shape == (2, 3)


def test_plugin_model_takes_config(toy_plugin):
    wide, narrow = zoo.get_model("mlp.toy"), zoo.get_model("mlp.toy", hidden=2)
    assert narrow.config == {"hidden": 2} and narrow.plugin == "toy-plugin"
    assert sum(p.numel() for p in narrow.build().parameters()) < sum(p.numel() for p in wide.build().parameters())
    with pytest.raises(ZooError, match="unknown config"):
        zoo.get_model("mlp.toy", depth=3)


def test_plugin_backend_is_registered(toy_plugin):
    assert isinstance(registry.backends()["toy-eager"], ToyBackend)
    backend = zoo.get_backend("toy-eager")
    assert backend.probe("cpu").ok
    assert not backend.probe("cuda").ok and "CPU only" in backend.probe("cuda").reason


def test_plugin_backend_exports_verifies_and_loads(toy_plugin, repository):
    art = zoo.export("mlp.toy", "toy-eager", repository=repository)
    assert art.path == repository / "mlp.toy.toy-eager.fp32"
    assert art.manifest["model"]["plugin"] == "toy-plugin" and art.manifest["parity"]["passed"]
    outputs = zoo.load(art.path)({"features": np.ones((5, 4), np.float32)})
    assert outputs["logits"].shape == (5, 3)
    assert zoo.verify(art.path)["parity"]["passed"]


def test_unregistering_removes_models_and_backends(toy_plugin):
    assert "mlp.toy" in zoo.list_models()
    registry.unregister_plugin(toy_plugin)
    assert "mlp.toy" not in zoo.list_models()
    assert "toy-eager" not in registry.backends()
    with pytest.raises(UnknownModelError, match="unknown model 'mlp.toy'"):
        zoo.get_model("mlp.toy")


@pytest.mark.parametrize("pattern, expected", [
    ("mlp*", ["mlp.toy"]),
    ("*.toy", ["mlp.toy"]),
    ("MLP.*", ["mlp.toy"]),  # names are lowercase; patterns match regardless of case
    ("mlp.to?", ["mlp.toy"]),
    ("nomatch*", []),
])
def test_wildcard_filtering(toy_plugin, pattern, expected):
    assert zoo.list_models(pattern) == expected


def test_wildcard_filtering_of_builtin_models():
    everything = zoo.list_models()
    assert everything == sorted(everything)
    resnets = zoo.list_models("resnet*")
    assert {"resnet18", "resnet50", "resnet8.digits"} <= set(resnets)
    assert resnets == [name for name in everything if name.startswith("resnet")]
    assert zoo.list_models("*.digits") == [name for name in everything if name.endswith(".digits")]


# ---------------------------------------------------------------- broken plugins


def test_duplicate_model_name_names_both_plugins(register):
    class Duplicate:
        @zoo.hookimpl
        def zoo_register_models(self, register):
            register(mlp_spec("resnet18"))

    register(Duplicate(), name="dup-plugin")
    with pytest.raises(PluginError, match="'resnet18' is registered twice") as exc:
        zoo.list_models()
    assert "dup-plugin" in str(exc.value) and "zoo-vision" in str(exc.value)


def test_duplicate_backend_name_names_both_plugins(register):
    class Onnxruntime(ToyBackend):
        name = "onnxruntime"

    class Duplicate:
        @zoo.hookimpl
        def zoo_register_backends(self, register):
            register(Onnxruntime())

    register(Duplicate(), name="dup-backend-plugin")
    with pytest.raises(PluginError, match="'onnxruntime' is registered twice") as exc:
        registry.backends()
    assert "dup-backend-plugin" in str(exc.value) and "zoo-onnxruntime" in str(exc.value)


def test_registering_something_that_is_not_a_model_spec(register, plugin_warnings):
    class Confused:
        @zoo.hookimpl
        def zoo_register_models(self, register):
            register(mlp_spec("mlp.confused"))
            register(ToyBackend())

    register(Confused(), name="confused-plugin")
    # the plugin is left out, all of it, with a warning; the registry survives it
    assert "resnet18" in zoo.list_models() and "mlp.confused" not in zoo.list_models()
    assert plugin_warnings == [
        "plugin confused-plugin registered 'toy-eager', which is not a zoo.ModelSpec or a zoo.LazySpec; "
        "its models are left out"]


class Misspelled:
    @zoo.hookimpl
    def zoo_register_modles(self, register):  # sic: the hook is zoo_register_models
        register(mlp_spec())


def test_misspelled_hook_is_an_error(register):
    with pytest.raises(PluginError, match="zoo_register_modles"):
        register(Misspelled(), name="misspelled-plugin")


def test_refused_plugin_is_not_left_registered(register):
    plugin = Misspelled()
    with pytest.raises(PluginError):
        register(plugin, name="misspelled-plugin")
    assert not registry.pm.is_registered(plugin)
    assert "resnet18" in zoo.list_models()


def test_plugin_file_that_fails_to_load(tmp_path):
    missing, broken = tmp_path / "missing.py", tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(PluginError, match="does not exist"):
        registry.load_plugin_file(missing)
    with pytest.raises(PluginError, match="failed to load: boom"):
        registry.load_plugin_file(broken)
    assert "zoo_local_plugin_broken" not in registry.plugin_names()


# ---------------------------------------------------------------- local plugin files

LOCAL_PLUGIN = """\
import numpy as np
import torch

import zoo


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name={name!r}, domain="tabular", task="classification",
        inputs=(zoo.TensorSpec("features", "float32", ("batch", 4)),),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 3)),),
        build=lambda: torch.nn.Linear(4, 3),
        sample=lambda batch, rng: {{"features": rng.standard_normal((batch, 4)).astype(np.float32)}},
    ))
"""


def write_plugin(path: Path, model: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(LOCAL_PLUGIN.format(name=model))
    return path



def listed(result: subprocess.CompletedProcess) -> dict[str, str]:
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return {row["name"]: row["plugin"] for row in json.loads(result.stdout)}


def test_plugin_file_from_the_command_line(tmp_path):
    plugin = write_plugin(tmp_path / "local_models.py", "linear.local")
    models = listed(zoo_cli("--plugin", str(plugin), "list", "--json", cwd=tmp_path))
    assert "local_models" in models["linear.local"]
    assert models["resnet8.digits"] == "zoo-vision (vision)"


def test_plugin_files_from_the_environment(tmp_path):
    first = write_plugin(tmp_path / "first.py", "linear.first")
    second = write_plugin(tmp_path / "second.py", "linear.second")
    models = listed(zoo_cli("list", "--json", cwd=tmp_path, ZOO_PLUGINS=os.pathsep.join([str(first), str(second)])))
    assert "first" in models["linear.first"] and "second" in models["linear.second"]


def test_misspelled_hook_in_a_plugin_file_is_an_error_at_start_up(tmp_path):
    plugin = tmp_path / "typo.py"
    plugin.write_text("import zoo\n\n\n@zoo.hookimpl\ndef zoo_register_modles(register):\n    pass\n")
    result = zoo_cli("--plugin", str(plugin), "list", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    # one error (the line may wrap: see test_cli's test_long_error_message_stays_on_one_line)
    assert result.stderr.startswith("error: ") and result.stderr.count("error:") == 1
    assert "zoo_register_modles" in result.stderr


def test_a_plugin_file_imports_a_module_beside_it(tmp_path):
    """It was left out: "No module named 'wine'", unless PYTHONPATH named its folder."""
    folder = tmp_path / "mine"
    write_plugin(folder / "shared.py", "linear.shared")
    (folder / "models.py").write_text("from shared import zoo_register_models  # noqa: F401\n")
    models = listed(zoo_cli("--plugin", str(folder / "models.py"), "list", "--json", cwd=tmp_path))
    assert "linear.shared" in models


def test_plugin_files_with_the_same_name(tmp_path):
    a = write_plugin(tmp_path / "a" / "models.py", "linear.a")
    b = write_plugin(tmp_path / "b" / "models.py", "linear.b")
    models = listed(zoo_cli("--plugin", str(a), "--plugin", str(b), "list", "--json", cwd=tmp_path))
    assert {"linear.a", "linear.b"} <= set(models)


# ---------------------------------------------------------------- hooks are documented


def test_hookspecs_are_typed_and_documented():
    assert {"zoo_register_models", "zoo_register_backends"} <= set(HOOKS)
    for name in HOOKS:
        hook = getattr(hookspecs, name)
        assert inspect.getdoc(hook), f"{name} has no docstring"
        params = inspect.signature(hook).parameters
        assert list(params) == ["register"], f"{name} should take one `register` callback"
        assert params["register"].annotation is not inspect.Parameter.empty


@pytest.mark.parametrize("hook", HOOKS)
def test_plugin_hooks_are_documented(hook):
    assert README.is_file(), "README.md is missing"
    assert hook in README.read_text(), f"hook {hook} (zoo/hookspecs.py) is not documented in README.md"
