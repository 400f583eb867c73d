"""The plugin manager and the registry of models and backends built from it.

Plugins come from the entry-point group ``zoo`` (built-in and third-party alike), from
files named with ``--plugin`` or ``ZOO_PLUGINS``, from ``zoo.register`` in a notebook
or script (`zoo.inline`), or from `register_plugin` in tests. The registry is built
lazily on first use and rebuilt when plugins change.

The registry survives its plugins: a plugin that fails to import, whose hook raises, or
that registers something that is not a spec or backend is left out, with one warning on
the ``zoo.plugins`` logger that names it, and every other plugin still registers. Two
things stay errors, because no single plugin can be left out for them: a name that two
plugins register (which model it means would depend on install order), and a hook zoo
does not define in a local file or `register_plugin` call (a typo must not be silent).

A model may be registered as a `LazySpec`: its name now, its spec made on first use.
Looking one model up makes only that one, so a process that exports `resnet8.digits`
does not pay for reading a transformers config it never uses; `models()` and `zoo list`
make them all. A lazy spec that fails is left out of `models()` with a warning, and
looking it up by name raises `PluginError` saying why. A backend may be registered as a
`LazyBackend` the same way: a backend whose module imports its engine (PyTorch, say) is
imported only by the processes that use it, so serving an ONNX Runtime artifact imports
no PyTorch; `backends()` and `zoo backends` make them all.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pluggy

from . import hookspecs
from .backend import Availability, Backend, declared_wrong
from .errors import PluginError, UnknownBackendError, UnknownModelError, UsageError, first_line
from .spec import ModelSpec, name_matches

log = logging.getLogger("zoo.plugins")


@dataclass(frozen=True)
class LazySpec:
    """A model registered by name whose spec is made when it is first looked up.

    For specs that are costly to make (a model's config read through a heavy library):
    ``register(zoo.LazySpec("bert.mine", make_bert_spec))`` in `zoo_register_models`.
    `make()` takes no arguments and returns a `ModelSpec` named `name`."""

    name: str
    make: Callable[[], ModelSpec]

@dataclass(frozen=True)
class LazyBackend:
    """A backend registered by name whose object is made when it is first looked up.

    For a backend plugin whose module imports a heavy engine at its top:
    ``register(zoo.LazyBackend("mine", lambda: importlib.import_module("my_backend.impl").MyBackend()))``
    in `zoo_register_backends`. `make()` takes no arguments and returns a `Backend` named `name`.
    `devices`, where given, are the backend's `devices`, declared here so that a command can
    check a `--device` name without making the backend (and importing its engine); the
    backend made must declare the same ones."""

    name: str
    make: Callable[[], Backend]
    devices: tuple[str, ...] = ()


pm = pluggy.PluginManager("zoo")
pm.add_hookspecs(hookspecs)

#: every registered model by name: its spec, or the LazySpec not made yet; with its plugin's label
_models: dict[str, tuple[ModelSpec | LazySpec, str]] | None = None
#: every registered backend by name: the backend, or the LazyBackend not made yet; with its plugin's label
_backends: dict[str, tuple[Backend | LazyBackend, str]] | None = None
_entry_points_loaded = False
#: plugin files loaded so far, so benchmark worker processes can load the same ones
plugin_files: list[str] = []
#: what users read for a plugin name: "zoo-vision (vision)" for an entry point, a file's name
_labels: dict[str, str] = {}
#: the plugins a hook left out at the last collection, by kind ("model", "backend"), label -> why
_left_out: dict[str, dict[str, str]] = {"model": {}, "backend": {}}
#: where a plugin comes from, by label: {"distribution": name, "version": v} or {"file": name};
#: manifests record it, so an artifact can say what to install when its plugin is absent
_origins: dict[str, dict[str, str]] = {}
#: warnings already given, by plugin label: the registry is rebuilt whenever plugins
#: change, and a broken plugin is reported once, not at every rebuild
_warned: dict[str, set[str]] = {}


def _warn(label: str, message: str) -> None:
    if message not in _warned.setdefault(label, set()):
        _warned[label].add(message)
        log.warning(message)


def load_plugin_file(path: str | os.PathLike[str], *, warn: bool = False) -> None:
    """Load a local plugin module from a .py file and register it.

    A file that does not exist or fails to import raises `PluginError`; with `warn`
    (``--plugin``, ``ZOO_PLUGINS``) it is left out with a warning instead, so the other
    plugins still register. A hook zoo does not define is an error either way."""
    file = Path(path).expanduser().resolve()
    if str(file) in plugin_files:
        return
    try:
        module = _import_file(path, file)
    except PluginError as exc:
        if not warn:
            raise
        _warn(file.name, f"{exc}; it is left out")
        return
    register_plugin(module, name=_plugin_name(file), label=file.name, origin={"file": file.name})
    plugin_files.append(str(file))


def _import_file(path: str | os.PathLike[str], file: Path) -> object:
    if file.suffix != ".py" or not file.is_file():
        raise PluginError(f"plugin file {path} does not exist or is not a .py file")
    name = _plugin_name(file)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    if str(file.parent) not in sys.path:  # its own modules beside it import, as `python file.py`'s do (after
        sys.path.append(str(file.parent))  # the installed packages: a file there named as one shadows nothing)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise PluginError(f"plugin file {path} failed to load: {first_line(exc)}") from exc
    sys.modules[name] = module
    return module


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


def register_plugin(plugin: object, name: str | None = None, label: str | None = None,
                    origin: dict[str, str] | None = None) -> None:
    """Register a plugin object; a plugin with an unknown hook is refused and not kept.

    `label` is how messages and `zoo list` name it (default: its plugin name); `origin`
    where it comes from (see `plugin_origin`)."""
    try:
        name = pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:  # a hook's arguments differ from the spec's
        raise PluginError(_invalid(exc, label or name or pm.get_canonical_name(plugin))) from exc
    if name is None:  # blocked with pm.set_blocked
        return
    label = _labels[name] = label or name
    if origin:
        _origins[label] = dict(origin)
    try:
        _check()
    except PluginError:
        unregister_plugin(plugin)
        raise
    finally:
        invalidate()
    if not pm.get_hookcallers(plugin):
        _warn(label, f"plugin {label} implements no zoo hook; did you forget @zoo.hookimpl?")


def unregister_plugin(plugin: object) -> None:
    name = pm.get_name(plugin)
    pm.unregister(plugin)
    label = _labels.pop(name, name)
    _warned.pop(label, None)  # registered again, it is reported again
    _origins.pop(label, None)
    invalidate()


def invalidate() -> None:
    global _models, _backends
    _models = _backends = None


def _check() -> None:
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(_invalid(exc)) from exc


def _invalid(exc: pluggy.PluginValidationError, label: str | None = None) -> str:
    """Name the plugin and the hooks it got wrong once, and the hooks that do exist."""
    callers = pm.get_hookcallers(exc.plugin) or []
    unknown = [h.name for h in callers if not h.has_spec()]
    defined = ", ".join(n for n in vars(hookspecs) if n.startswith("zoo_"))
    name = label or _label(exc.plugin)
    if unknown:
        return f"plugin {name} implements {', '.join(unknown)}, which zoo does not define (hooks: {defined})"
    for hook in (n for n in vars(hookspecs) if n.startswith("zoo_")):  # pluggy says this over three lines
        function, spec = getattr(exc.plugin, hook, None), getattr(pm.hook, hook).spec
        if callable(function) and spec is not None:
            extra = [a for a in inspect.signature(function).parameters if a not in spec.argnames]
            if extra:
                return (f"plugin {name}: its {hook} takes {', '.join(extra)}, which the hook does not pass: "
                        f"write `def {hook}({', '.join(spec.argnames)}):`")
    return f"plugin {name} is invalid: {' '.join(str(exc).split())}"


def _label(plugin: object) -> str:
    name = pm.get_name(plugin)
    return _labels.get(name, name) if name else repr(plugin)


def _load_plugins() -> None:
    """Entry-point plugins (built-in and third-party alike), then ZOO_PLUGINS files.

    Deferred to first use so that a plugin module can `import zoo` at its top."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        _load_entry_points()
    for entry in filter(None, os.environ.get("ZOO_PLUGINS", "").split(os.pathsep)):
        load_plugin_file(entry, warn=True)


def _load_entry_points() -> None:
    """Every installed ``zoo`` entry point. One that fails to import, or that implements
    a hook zoo does not define (written for another zoo version, say), is left out with a
    warning naming its distribution."""
    for ep in importlib.metadata.entry_points(group="zoo"):
        if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
            continue
        label = f"{ep.dist.name} ({ep.name})" if ep.dist else ep.name
        origin = {"distribution": ep.dist.name, "version": ep.dist.version} if ep.dist else None
        try:
            register_plugin(ep.load(), name=ep.name, label=label, origin=origin)
        except PluginError as exc:
            _warn(label, f"{exc}; it is left out")
        except Exception as exc:
            _warn(label, f"plugin {label} failed to load: {first_line(exc)}; it is left out")


def _collect(hook: pluggy.HookCaller, kind: str, *cls: type) -> dict[str, tuple[Any, str]]:
    """What each plugin registers through `hook`, by name, with the plugin's label.

    A plugin whose hook raises or registers something that is not a `cls` is left out of
    this hook, all of it (half a plugin's models would be a puzzle), with a warning."""
    found: dict[str, tuple[object, str]] = {}
    _left_out[kind] = {}
    for impl in hook.get_hookimpls():
        label = _label(impl.plugin)
        items: list[Any] = []

        def register(item: object) -> None:
            items.append(item)

        try:
            # as pluggy calls a hook: with the parameters the implementation names
            returned = impl.function(**({"register": register} if "register" in impl.argnames else {}))
            wrong = _unregistered(impl, returned, items, kind) or next(
                filter(None, (_wrong(item, kind, *cls) for item in items)), None)
        except Exception as exc:
            # a hook without its parameter that still calls register(...): that slip, not the NameError
            slip = isinstance(exc, NameError) and exc.name == "register" and "register" not in impl.argnames
            wrong = _unregistered(impl, None, items, kind) if slip else \
                f"failed in {hook.name}{_where(exc, impl.function)}: {first_line(exc)}"
        if wrong:
            _warn(label, f"plugin {label} {wrong}; its {kind}s are left out")
            _left_out[kind][label] = wrong
            continue
        for item in items:
            if item.name in found:
                raise PluginError(f"{kind} {item.name!r} is registered twice: by {found[item.name][1]} and by {label}")
            found[item.name] = (item, label)
    return found


def _where(exc: BaseException, hook: Callable) -> str:
    """" at FILE:LINE (CODE)", the last line of the plugin's hook module that the failure
    passed through: an AxisRange or TensorSpec knows neither its model nor its field, the
    line that builds it does."""
    file = getattr(getattr(hook, "__code__", None), "co_filename", None)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == file]
    if not frames:
        return ""
    line = (frames[-1].line or "").strip()
    return f" at {Path(file).name}:{frames[-1].lineno}" + (f" ({line[:160]})" if line else "")


def _unregistered(impl: pluggy.HookImpl, returned: object, items: list, kind: str) -> str | None:
    """Why a hook that registered nothing did so, where its writer meant it to register:
    it has no `register` parameter, or it returned what it meant to register."""
    hook = impl.function.__name__
    if "register" not in impl.argnames:
        return (f"defines {hook}() without its `register` parameter, so it registers nothing: write "
                f"`def {hook}(register):` and call register(...) once per {kind}")
    if returned is not None and not items:
        return (f"returned a {type(returned).__name__} from {hook} and registered nothing: zoo does not read "
                f"the hook's return value; call register(...) once per {kind}")
    return None


def _wrong(item: object, kind: str, *cls: type) -> str | None:
    """Why `item` cannot be registered as a `kind` (an instance of one of `cls`), or None."""
    name = getattr(item, "name", None)
    if not isinstance(name, str):
        return f"registered a {kind} without a name: {item!r}"
    if not isinstance(item, cls):
        return f"registered {name!r}, which is not a {' or a '.join(f'zoo.{c.__name__}' for c in cls)}"
    if isinstance(item, Backend) and (why := declared_wrong(item)):
        return f"registered backend {name!r}: {why}"
    return None


def _registered() -> dict[str, tuple[ModelSpec | LazySpec, str]]:
    """Every registered model's entry by name, lazy specs not made."""
    global _models
    if _models is None:
        _load_plugins()
        _check()
        found = _collect(pm.hook.zoo_register_models, "model", ModelSpec, LazySpec)
        _models = {name: (_labelled(item, label), label) for name, (item, label) in sorted(found.items())}
    return _models


def _labelled(item: ModelSpec | LazySpec, label: str) -> ModelSpec | LazySpec:
    return item if isinstance(item, LazySpec) or item.plugin else replace(item, plugin=label)


def _spec(name: str) -> ModelSpec:
    """The spec registered as `name`, made now if it was registered lazily."""
    table = _registered()
    item, label = table[name]
    if isinstance(item, ModelSpec):
        return item
    spec = _labelled(_made(item, label, "model", ModelSpec, "failed to make its spec"), label)
    if _models is table:  # not rebuilt meanwhile (make() may register plugins)
        table[name] = (spec, label)
    return spec


def _made(lazy: LazySpec | LazyBackend, label: str, kind: str, cls: type, failing: str) -> Any:
    """What `lazy.make()` makes, checked to be a `cls` named as registered; PluginError
    naming the plugin, and what it made or why it failed, otherwise."""
    name = lazy.name
    try:
        made = lazy.make()
    except Exception as exc:
        raise PluginError(f"{kind} {name!r} of plugin {label} {failing}: {first_line(exc)}") from exc
    if not isinstance(made, cls) or made.name != name:
        what = f"{'spec' if cls is ModelSpec else kind} {made.name!r}" if isinstance(made, cls) else repr(made)[:100]
        raise PluginError(f"{kind} {name!r} of plugin {label}: its {type(lazy).__name__} made {what}, not a "
                          f"zoo.{cls.__name__} named {name!r}")
    if isinstance(made, Backend) and (why := declared_wrong(made)):
        raise PluginError(f"backend {name!r} of plugin {label}: {why}")
    if isinstance(lazy, LazyBackend) and lazy.devices and set(lazy.devices) != set(made.devices):
        raise PluginError(f"backend {name!r} of plugin {label}: its LazyBackend declares devices "
                          f"{list(lazy.devices)}, the backend made {list(made.devices)}")
    return made


def models() -> dict[str, ModelSpec]:
    """Every registered model's spec by name, lazy ones made now (any that fails is left
    out, with a warning)."""
    return {name: spec for name in _registered() if (spec := _made_or_warned(name)) is not None}


def _made_or_warned(name: str) -> ModelSpec | None:
    try:
        return _spec(name)
    except PluginError as exc:
        _warn(_registered()[name][1], f"{exc}; it is left out")
        return None


def is_registered(name: str) -> bool:
    """Whether a plugin registers a model named `name` (a lazy spec is not made)."""
    return name in _registered()


def find_model(name: str) -> ModelSpec | None:
    """The spec registered as `name`, or None where no plugin registers it or its lazy spec
    fails to be made (with a warning): for callers that can go on without the plugin."""
    return _made_or_warned(name) if is_registered(name) else None


def _registered_backends() -> dict[str, tuple[Backend | LazyBackend, str]]:
    """Every registered backend's entry by name, lazy ones not made."""
    global _backends
    if _backends is None:
        _load_plugins()
        _check()
        _backends = dict(sorted(_collect(pm.hook.zoo_register_backends, "backend", Backend, LazyBackend).items()))
    return _backends


def _backend(name: str) -> Backend:
    """The backend registered as `name`, made now if it was registered lazily."""
    table = _registered_backends()
    item, label = table[name]
    if isinstance(item, Backend):
        return item
    backend = _made(item, label, "backend", Backend, "failed to load")
    if _backends is table:  # not rebuilt meanwhile
        table[name] = (backend, label)
    return backend


def backends() -> dict[str, Backend]:
    """Every registered backend by name, lazy ones made now (any that fails is left out,
    with a warning)."""
    return {name: backend for name in list(_registered_backends()) if (backend := _backend_or_warned(name)) is not None}


def _backend_or_warned(name: str) -> Backend | None:
    try:
        return _backend(name)
    except PluginError as exc:
        _warn(_registered_backends()[name][1], f"{exc}; it is left out")
        return None


def backend_names() -> list[str]:
    """Every registered backend's name, none made."""
    return list(_registered_backends())


def devices() -> list[str]:
    """Every device some registered backend runs on, sorted: a lazy backend's declared
    devices where it declares them, else the backend made now (one that fails is left out,
    with a warning, as in `backends()`)."""
    found: set[str] = set()
    for name, (item, _) in list(_registered_backends().items()):
        if isinstance(item, LazyBackend) and item.devices:
            found.update(item.devices)
        elif (backend := _backend_or_warned(name)) is not None:
            found.update(backend.devices)
    return sorted(found)


def list_models(pattern: str | None = None) -> list[str]:
    """Names of registered models, optionally filtered by a wildcard (`resnet*`); the
    matching lazy specs are made, and one that fails is left out with a warning."""
    if pattern is not None and not isinstance(pattern, str):
        raise UsageError(f"a model name pattern is a str (`resnet*`) or None, not {pattern!r}")
    return [n for n in _registered() if name_matches(n, pattern) and _made_or_warned(n) is not None]


def get_model(name: str | ModelSpec, **config: object) -> ModelSpec:
    """The spec registered under `name`, for `config` overrides if given."""
    if isinstance(name, ModelSpec):
        return name.configure(**config)
    if not isinstance(name, str):
        raise UsageError(f"a model is a registered name (a str) or a zoo.ModelSpec, not {name!r}")
    table = _registered()
    if name not in table:
        # a shared family (`resnet8.nosuch`), else a misspelling (`resnt8.digits`)
        close = [n for n in table if name.split(".")[0] in n] or difflib.get_close_matches(name, list(table), 5, 0.75)
        hint = f"; did you mean {', '.join(close[:5])}?" if close else "; `zoo list` shows them all"
        failed = "".join(f"; plugin {label} registered no models, as it {why}"
                         for label, why in _left_out["model"].items())
        raise UnknownModelError(f"unknown model {name!r}{failed or hint}")
    return _spec(name).configure(**config)


def get_backend(name: str) -> Backend:
    """The backend registered as `name` (a lazy one made now; only that one)."""
    found = _registered_backends()
    if name not in found:
        raise UnknownBackendError(f"unknown backend {name!r}; registered: {', '.join(found) or 'none'}")
    return _backend(name)


def known_backend(name: str, option: str) -> Backend:
    """The backend registered as `name`; a name nothing registered is a usage error naming
    the command-line `option` (exit 2), as an unknown model is, not `UnknownBackendError`'s 1."""
    try:
        return get_backend(name)
    except UnknownBackendError as exc:
        raise UsageError(f"{option}: {exc}") from None


def probe(backend: Backend, device: str) -> Availability:
    """Whether `backend` runs on `device` here. A probe is a plugin's code: one that raises
    says the backend cannot run, as `zoo backends` lists it, rather than ending the command."""
    try:
        answer = backend.probe(device)
    except Exception as exc:
        return Availability(False, f"probe failed: {first_line(exc)}")
    if not isinstance(answer, Availability):
        return Availability(False, f"probe returned {answer!r}, not a zoo.Availability")
    return answer


def only_here(name: str, backend: bool = False) -> bool:
    """Whether the model (or `backend`) `name` exists in this process only: registered by
    its own code (`zoo.register` in a script, `register_plugin` with an object) or not at
    all, not by an installed plugin or a plugin file, which a fresh process loads too."""
    table = _registered_backends() if backend else _registered()
    return name not in table or not _origins.get(table[name][1])


def backend_record(name: str) -> dict[str, Any]:
    """An artifact's account of the plugin its backend came from: its label and where it
    comes from (`plugin_origin`), so a process without it can say what to install."""
    label = _registered_backends()[name][1]
    return {"plugin": label, "origin": plugin_origin(label)}


def backend_missing(name: str, record: Mapping[str, Any], artifact: str) -> str:
    """What to install or load to run `artifact`, whose backend `name` no plugin here
    registers, from its manifest's "backend" block (`backend_record`)."""
    label, origin = record.get("plugin") or "", record.get("origin") or {}
    here = f"registered here: {', '.join(_registered_backends()) or 'none'}"
    if "distribution" in origin:
        how = (f"it came from plugin {label} (distribution {origin['distribution']}, version "
               f"{origin.get('version', '?')}): install it (`pip install {origin['distribution']}`)")
    elif "file" in origin:
        how = (f"it came from the plugin file {origin['file']}: load it (`zoo --plugin {origin['file']}`, or "
               f"ZOO_PLUGINS)")
    elif label:
        how = f"it came from plugin {label}: install or load it (--plugin)"
    else:
        how = "install or load the plugin that registers it (--plugin)"
    return f"artifact {artifact} runs on backend {name!r}, which no plugin here registers ({here}); {how}"


def plugin_origin(label: str) -> dict[str, str]:
    """Where the plugin labelled `label` comes from: {"distribution": name, "version": v}
    for an installed distribution, {"file": name} for a plugin file, {} if unknown."""
    return dict(_origins.get(label, {}))


def plugin_names() -> Iterable[str]:
    return [pm.get_name(p) or repr(p) for p in pm.get_plugins()]
