"""An artifact's model without its plugin: the spec its manifest describes.

An artifact loads, serves, benchmarks and verifies from its own directory, as Triton
loads a repository with no Python of the model's author: the plugin that defined the
model may not be installed where the artifact runs, or the model came from
`zoo.register` in a notebook that is gone. So `Artifact.spec()` is

- the registered spec at the recorded config when the plugin is loaded, refused when
  its signature is no longer the manifest's (the artifact came from another version of
  the model, and its runner would be fed and read by the wrong signature);
- else the spec rebuilt here from the manifest: name, domain, task, signature with value
  ranges, axes, tolerances, int8 method, config and its outputs' class labels, whose
  `sample` draws from the stored test vectors (`zoo.vectors`). What needs the plugin's
  code raises `PluginNotLoadedError` saying what to install: `build` (the PyTorch
  module) and, in `zoo predict`, domain-native inputs.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from typing import Any, Mapping

from . import registry
from .errors import ArtifactError, PluginNotLoadedError, StaleArtifactError, ZooError
from .inline import NAME as INLINE  # the label of models registered from a notebook or script
from .spec import AxisRange, ModelSpec, TensorSpec, Tolerance
from .vectors import sampler

log = logging.getLogger("zoo")
#: the fields of `ModelSpec.to_json()` a manifest keeps to rebuild the spec without its plugin
RECORDED = ("name", "plugin", "config", "domain", "task", "description", "tolerances", "quantization", "metric",
            "raw_input")


def model_record(spec: ModelSpec) -> dict[str, Any]:
    """The manifest's "model" block: what `described_spec` rebuilds the spec from, and
    where its plugin comes from (`registry.plugin_origin`), to say what to install.
    Outputs' class labels are kept here, {output: [label, ...]} for the outputs that have
    them, not in the signature: renaming a class does not make an artifact stale."""
    data = spec.to_json()
    labels = {t.name: list(t.labels) for t in spec.outputs if t.labels is not None}
    return {**{k: data[k] for k in RECORDED}, **({"labels": labels} if labels else {}),
            "generates_text": spec.detokenize is not None, "origin": registry.plugin_origin(spec.plugin)}


def signature(spec: ModelSpec) -> dict[str, Any]:
    """The manifest's "signature" block: names, dtypes, shapes and value ranges (not
    labels, which the "model" block records)."""
    return {"inputs": [_signed(t) for t in spec.inputs], "outputs": [_signed(t) for t in spec.outputs],
            "axes": {k: [r.min, r.opt, r.max] for k, r in spec.axes.items()}}


def _signed(t: TensorSpec) -> dict[str, Any]:
    return {k: v for k, v in t.to_json().items() if k != "labels"}


def artifact_spec(art) -> ModelSpec:
    """`Artifact.spec()`: the registered spec where its plugin is loaded, else the described one."""
    spec = registered_spec(art)
    if spec is not None:
        log.info("artifact %s: model %s as plugin %s registers it", art.name, spec.name, spec.plugin or "?")
        return spec
    log.info("artifact %s: model %s is not registered here; using the spec its manifest describes",
             art.name, art.model)
    return described_spec(art)


def registered_spec(art) -> ModelSpec | None:
    """The registered spec at the artifact's config, or None when no plugin registers the model."""
    name, config = art.model, art.manifest["model"].get("config", {})
    base = registry.find_model(name)
    if base is None:
        return None
    try:
        spec = base.configure(**config)
    except ZooError as exc:
        raise StaleArtifactError(f"artifact {art.name} was exported from another version of model {name}: "
                                 f"{exc}; re-export it (`zoo export {name} --force`)") from None
    recorded, now = art.manifest.get("signature", {}), signature(spec)
    differs = [part for part in now if recorded.get(part) != now[part]]
    if differs:
        part = differs[0]
        raise StaleArtifactError(
            f"artifact {art.name} was exported from another version of model {name}: its {part} "
            f"{_brief(recorded.get(part))} differ from {_brief(now[part])} as plugin {spec.plugin} registers the "
            f"model now; re-export it (`zoo export {name} --force`), or run it where that plugin is not loaded")
    return spec


def _brief(part: Any) -> str:
    if isinstance(part, dict):  # axes
        return ", ".join(f"{k} {v[0]}..{v[2]}" for k, v in part.items())
    if isinstance(part, list):  # tensors
        return "[" + ", ".join(f"{t['name']}:{t['dtype']}[{','.join(map(str, t['shape']))}]"
                               + (f" in {t['value_range']}" if t.get("value_range") else "") for t in part) + "]"
    return repr(part)


def described_spec(art) -> ModelSpec:
    """The spec the manifest describes (see the module docstring)."""
    manifest = art.manifest
    model = manifest["model"]
    try:
        sig = manifest["signature"]
        inputs = tuple(_tensor(t) for t in sig["inputs"])
        axes = {k: AxisRange(*v) for k, v in sig["axes"].items()}
        # manifests written before they recorded every tolerance: the one parity was held to
        tolerances = model.get("tolerances") or {manifest["precision"]: manifest["parity"]["tolerance"]}
        labels = model.get("labels") or {}  # manifests written before labels: none
        unknown = sorted(set(labels) - {t["name"] for t in sig["outputs"]})
        if unknown:
            raise ValueError(f"labels for {unknown}, which are not its outputs")

        def build():
            raise PluginNotLoadedError(needs_plugin(model, "rebuild its PyTorch module"))

        return ModelSpec(
            name=model["name"], domain=model.get("domain", ""), task=model.get("task", ""), inputs=inputs,
            outputs=tuple(_tensor(t, labels.get(t["name"])) for t in sig["outputs"]), build=build,
            sample=sampler(functools.cache(art.test_vectors), inputs, axes), axes=axes,
            description=model.get("description", ""), config=dict(model.get("config", {})),
            tolerances={p: _tolerance(t) for p, t in tolerances.items()},
            quantization=model.get("quantization") or manifest.get("quantization"), plugin=model.get("plugin", ""))
    except (KeyError, TypeError, ValueError, ZooError) as exc:
        raise ArtifactError(f"artifact {art.name}: its manifest does not describe model {model.get('name')} "
                            f"({type(exc).__name__}: {exc}); re-export it") from None


def _tensor(data: Mapping[str, Any], labels: list[str] | None = None) -> TensorSpec:
    value_range = data.get("value_range")
    return TensorSpec(data["name"], data["dtype"], tuple(data["shape"]),
                      tuple(value_range) if value_range is not None else None, labels)


def _tolerance(data: Mapping[str, Any]) -> Tolerance:
    compare = data.get("compare")
    return Tolerance(data["atol"], data.get("rtol", 0.0), data.get("metric_drop"),
                     tuple(compare) if compare is not None else None)


def with_raw_inputs(spec: ModelSpec, model: Mapping[str, Any]) -> ModelSpec:
    """`spec` taking the domain-native inputs its manifest records, whose preprocessing
    says which plugin to install (`zoo predict`, `zoo generate`; the server does not
    advertise them)."""
    kind = model["raw_input"]

    def missing(*_: Any) -> Any:
        raise PluginNotLoadedError(needs_plugin(model, f"turn {kind} inputs into tensors and its outputs into "
                                                       "results"))

    return replace(spec, raw_kind=kind, raw_binary=bool(model.get("raw_binary")),
                   preprocess=missing, postprocess=missing,
                   detokenize=missing if model.get("generates_text") else None)


def needs_plugin(model: Mapping[str, Any], purpose: str) -> str:
    """What to install or load, from a manifest's "model" block, to `purpose`."""
    name, label, origin = model["name"], model.get("plugin") or "", model.get("origin") or {}
    if "distribution" in origin:
        dist = origin["distribution"]
        return (f"model {name} was defined by plugin {label} (distribution {dist}, version "
                f"{origin.get('version', '?')} exported it); install it (`pip install {dist}`) to {purpose}")
    if "file" in origin:
        return (f"model {name} was defined by the plugin file {origin['file']}; load it (`zoo --plugin "
                f"{origin['file']}`, or ZOO_PLUGINS) to {purpose}")
    if label == INLINE:
        return f"model {name} was registered with zoo.register in a notebook or script; register it again to {purpose}"
    if label:
        return f"model {name} was defined by plugin {label}; install or load it (--plugin) to {purpose}"
    return f"model {name} was exported from a spec no plugin registered; register it (zoo.register) to {purpose}"
