"""The hooks a zoo plugin implements (pluggy project name ``zoo``).

A plugin is a module or object with functions marked ``@zoo.hookimpl``, published
through the entry-point group ``zoo`` (built-in plugins are discovered exactly the same
way), loaded from a file with ``--plugin FILE``, or listed in ``ZOO_PLUGINS``
(paths separated by ``os.pathsep``). Implementing a hook that is not defined here is an
error at start-up for a local file, so a misspelled hook never fails silently; an
installed distribution with one (written for another zoo version, say) is left out with
a warning, as is a plugin that fails to import (see ``zoo.registry``).

Both hooks take a ``register`` callback, as the ``llm`` tool's hooks do: a plugin calls
it once per thing it adds. Every implementation is called; results are not used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pluggy

if TYPE_CHECKING:
    from .backend import Backend
    from .spec import ModelSpec

hookspec = pluggy.HookspecMarker("zoo")
hookimpl = pluggy.HookimplMarker("zoo")


@hookspec
def zoo_register_models(register: Callable[["ModelSpec"], None]) -> None:
    """Register the models this plugin provides.

    Called once, when the registry is first used.

    :param register: call ``register(spec)`` with one :class:`zoo.ModelSpec` per model,
        or a :class:`zoo.LazySpec` (a name and a function that makes the spec) for a spec
        that is costly to make: it is made when the model is first looked up.
        A name already registered by any plugin raises :class:`zoo.errors.PluginError`
        naming both plugins. If this hook raises, or registers something that is neither,
        none of the plugin's models are registered and a warning names it.
    """


@hookspec
def zoo_register_backends(register: Callable[["Backend"], None]) -> None:
    """Register the export/inference backends this plugin provides.

    Called once, when the registry is first used. Registering must not import the
    backend's library: a backend that cannot run here is still listed, and its
    ``probe`` says why. A backend whose module imports its library at its top is
    registered as a :class:`zoo.LazyBackend` (its name now, its module imported when the
    backend is first looked up), so a process using another backend never imports it.

    :param register: call ``register(backend)`` with one :class:`zoo.Backend` instance
        (or :class:`zoo.LazyBackend`) per backend. A duplicate name raises :class:`zoo.errors.PluginError`. If this
        hook raises, or registers something that is not a ``Backend``, none of the
        plugin's backends are registered and a warning names it.
    """
