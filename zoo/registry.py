"""The plugin manager and the registry of models and backends built from it.

Plugins come from the entry-point group ``zoo`` (built-in and third-party alike),
from files named with ``--plugin`` or ``ZOO_PLUGINS``, or from ``pm.register`` in
tests. The registry is built lazily on first use and rebuilt when plugins change.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Iterable

import pluggy

from . import hookspecs
from .backend import Backend
from .errors import PluginError, UnknownBackendError, UnknownModelError
from .spec import ModelSpec

pm = pluggy.PluginManager("zoo")
pm.add_hookspecs(hookspecs)

_models: dict[str, ModelSpec] | None = None
_backends: dict[str, Backend] | None = None
_entry_points_loaded = False
#: plugin files loaded so far, so benchmark worker processes can load the same ones
plugin_files: list[str] = []


def load_plugin_file(path: str | os.PathLike[str]) -> None:
    """Load a local plugin module from a .py file and register it."""
    file = Path(path).expanduser().resolve()
    if file.suffix != ".py" or not file.is_file():
        raise PluginError(f"plugin file {path} does not exist or is not a .py file")
    if str(file) in plugin_files:
        return
    name = _plugin_name(file)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise PluginError(f"plugin file {path} failed to load: {exc}") from exc
    sys.modules[name] = module
    register_plugin(module, name=name)
    plugin_files.append(str(file))


def _plugin_name(file: Path) -> str:
    # the path's hash keeps two files named models.py in different folders apart
    return f"zoo_local_plugin_{file.stem}_{hashlib.sha256(str(file).encode()).hexdigest()[:8]}"


def unload_plugin_file(path: str | os.PathLike[str]) -> None:
    """Unregister a plugin file loaded with `load_plugin_file` (nothing if it was not)."""
    file = Path(path).expanduser().resolve()
    if str(file) in plugin_files:
        plugin_files.remove(str(file))
        plugin = pm.get_plugin(_plugin_name(file))
        if plugin is not None:
            unregister_plugin(plugin)


def register_plugin(plugin: object, name: str | None = None) -> None:
    """Register a plugin object; a plugin with an unknown hook is refused and not kept."""
    pm.register(plugin, name=name)
    try:
        _check()
    except PluginError:
        pm.unregister(plugin)
        raise
    finally:
        invalidate()


def unregister_plugin(plugin: object) -> None:
    pm.unregister(plugin)
    invalidate()


def invalidate() -> None:
    global _models, _backends
    _models = _backends = None


def _check() -> None:
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(_invalid(exc)) from exc


def _invalid(exc: pluggy.PluginValidationError) -> str:
    """Name the plugin and the hooks it got wrong once, and the hooks that do exist."""
    callers = pm.get_hookcallers(exc.plugin) or []
    unknown = [h.name for h in callers if not h.has_spec()]
    defined = ", ".join(n for n in vars(hookspecs) if n.startswith("zoo_"))
    name = pm.get_name(exc.plugin) or repr(exc.plugin)
    if unknown:
        return f"plugin {name} implements {', '.join(unknown)}, which zoo does not define (hooks: {defined})"
    return f"plugin {name} is invalid: {exc}"


def _load_plugins() -> None:
    """Entry-point plugins (built-in and third-party alike), then ZOO_PLUGINS files.

    Deferred to first use so that a plugin module can `import zoo` at its top."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        try:
            pm.load_setuptools_entrypoints("zoo")
        except pluggy.PluginValidationError as exc:
            raise PluginError(_invalid(exc)) from exc
        except Exception as exc:
            raise PluginError(f"an installed zoo plugin failed to load: {exc}") from exc
    for entry in filter(None, os.environ.get("ZOO_PLUGINS", "").split(os.pathsep)):
        load_plugin_file(entry)


def _collect(hook: pluggy.HookCaller, kind: str) -> dict:
    found: dict[str, tuple[object, str]] = {}

    for impl in hook.get_hookimpls():
        plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
        dist = dict(pm.list_plugin_distinfo()).get(impl.plugin)
        label = f"{dist.project_name} ({plugin_name})" if dist else plugin_name

        def register(item: object, _label: str = label) -> None:
            name = getattr(item, "name", None)
            if not isinstance(name, str):
                raise PluginError(f"plugin {_label} registered a {kind} without a name: {item!r}")
            if name in found:
                raise PluginError(f"{kind} {name!r} is registered twice: by {found[name][1]} and by {_label}")
            found[name] = (item, _label)

        impl.function(register=register)
    return found


def models() -> dict[str, ModelSpec]:
    global _models
    if _models is None:
        _load_plugins()
        _check()
        found = _collect(pm.hook.zoo_register_models, "model")
        out = {}
        for name, (spec, label) in sorted(found.items()):
            if not isinstance(spec, ModelSpec):
                raise PluginError(f"plugin {label} registered {name!r}, which is not a zoo.ModelSpec")
            out[name] = spec if spec.plugin else replace(spec, plugin=label)
        _models = out
    return _models


def backends() -> dict[str, Backend]:
    global _backends
    if _backends is None:
        _load_plugins()
        _check()
        found = _collect(pm.hook.zoo_register_backends, "backend")
        for name, (backend, label) in found.items():
            if not isinstance(backend, Backend):
                raise PluginError(f"plugin {label} registered {name!r}, which is not a zoo.Backend")
        _backends = {name: b for name, (b, _) in sorted(found.items())}
    return _backends


def list_models(pattern: str | None = None) -> list[str]:
    """Names of registered models, optionally filtered by a wildcard (`resnet*`)."""
    return [name for name, spec in models().items() if spec.matches(pattern)]


def get_model(name: str | ModelSpec, **config: object) -> ModelSpec:
    """The spec registered under `name`, for `config` overrides if given."""
    if isinstance(name, ModelSpec):
        return name.configure(**config)
    specs = models()
    if name not in specs:
        close = [n for n in specs if name.split(".")[0] in n]
        hint = f"; did you mean {', '.join(close[:5])}?" if close else "; `zoo list` shows them all"
        raise UnknownModelError(f"unknown model {name!r}{hint}")
    return specs[name].configure(**config)


def get_backend(name: str) -> Backend:
    found = backends()
    if name not in found:
        raise UnknownBackendError(f"unknown backend {name!r}; registered: {', '.join(found) or 'none'}")
    return found[name]


def plugin_names() -> Iterable[str]:
    return [pm.get_name(p) or repr(p) for p in pm.get_plugins()]
