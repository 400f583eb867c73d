"""Models and backends registered inline, from a notebook or script: ``zoo.register(spec)``.

They come through a small plugin of this process, registered with the plugin manager
like any other, so the registry treats them as it treats an installed plugin's: the
same checks, the same error for a name another plugin has. The difference is timing:
a plugin's mistakes surface when the registry is built, an inline one's at once.
"""

from __future__ import annotations

from typing import Callable

from . import registry
from .backend import Backend
from .errors import PluginError, ZooError
from .hookspecs import hookimpl
from .spec import ModelSpec

NAME = "zoo.register"  # the plugin's name, and what `zoo list` shows as its plugin


class _Inline:
    """The plugin: whatever `register` and `register_backend` were given, by name.

    Their types are checked before anything is added: a plugin that registers something
    invalid is left out whole, and this one holds everything the session registered."""

    def __init__(self) -> None:
        self.models: dict[str, ModelSpec] = {}
        self.backends: dict[str, Backend] = {}

    @hookimpl
    def zoo_register_models(self, register: Callable[[ModelSpec], None]) -> None:
        for spec in self.models.values():
            register(spec)

    @hookimpl
    def zoo_register_backends(self, register: Callable[[Backend], None]) -> None:
        for backend in self.backends.values():
            register(backend)


_plugin = _Inline()


def register(spec: ModelSpec | registry.LazySpec) -> None:
    """Add a model, as a plugin's `zoo_register_models` would: a `ModelSpec`, or a
    `zoo.LazySpec` whose spec is made when the model is first looked up.

    `list_models`, `export`, `load` and `verify` know it in this process from then on. A
    name another plugin registered raises `PluginError` naming both; to change a spec
    registered here, `unregister` its name first."""
    if not isinstance(spec, (ModelSpec, registry.LazySpec)):
        raise PluginError(f"zoo.register takes a zoo.ModelSpec or a zoo.LazySpec, not {spec!r}")
    _add(_plugin.models, spec, "model", lambda: registry.is_registered(spec.name))


def register_backend(backend: Backend) -> None:
    """Add a backend (an instance of a `zoo.Backend` subclass), as `zoo_register_backends` would."""
    if not isinstance(backend, Backend):
        raise PluginError(f"zoo.register_backend takes a zoo.Backend instance, not {backend!r}")
    _add(_plugin.backends, backend, "backend", registry.backends)


def unregister(name: str) -> None:
    """Remove the model or backend named `name` that `register` or `register_backend` added."""
    if name not in _plugin.models and name not in _plugin.backends:
        raise ZooError(f"{name!r} was not added with zoo.register or zoo.register_backend")
    _plugin.models.pop(name, None)
    _plugin.backends.pop(name, None)
    registry.invalidate()


def _add(table: dict, item: ModelSpec | registry.LazySpec | Backend, kind: str, build: Callable[[], dict]) -> None:
    if item.name in table:
        raise PluginError(f"{kind} {item.name!r} is registered already by {NAME}; "
                          f"zoo.unregister({item.name!r}) first to replace it")
    if not registry.pm.is_registered(_plugin):
        registry.register_plugin(_plugin, name=NAME)
    table[item.name] = item
    registry.invalidate()
    try:
        build()  # the registry's own checks, now: a name another plugin has is refused here
    except PluginError:
        del table[item.name]
        registry.invalidate()
        raise
