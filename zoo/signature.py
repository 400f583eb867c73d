"""How a module meets its spec: inputs bound by name, outputs flattened by name.

The PyTorch reference, the training loop and every exporter call a module through this
one binding, so an artifact cannot agree with its reference by making the same mistake
(a BertModel whose spec lists `token_type_ids` before `attention_mask` gets each tensor
under its own name, not the second one as its mask).

Inputs: a forward whose parameters name every spec input, or that takes them all as
keywords (`forward(self, **inputs)`), is called by keyword. A
forward without named parameters (`forward(self, *inputs)`), or one with a single
input that the spec names differently (`forward(self, x)` for input "image"), is called
positionally in spec order, and `binding` says "positional". Anything else is
ambiguous and refused, naming the inputs the forward lacks.

Outputs: a tensor, a tuple or list (in spec order), or anything that names its outputs
(a dict, a named tuple, a dataclass, transformers' `ModelOutput`) mapped by name to the
spec's outputs; None entries are absent (as `ModelOutput` leaves unset fields), a
missing or extra name is an error naming it. `Signature` turns a module into one that
takes positional tensors and returns a plain tuple in spec order, which is what every
exporter captures: no artifact stores a third-party output class.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping, Sequence

import torch

from .errors import SignatureError
from .spec import ModelSpec

KEYWORD, POSITIONAL = "keyword", "positional"


def _innermost(module: Any) -> Any:
    """The user's module under the wrappers training puts around it (torch.compile, DDP)."""
    while True:
        inner = getattr(module, "_orig_mod", None) or (
            module.module if isinstance(module, torch.nn.parallel.DistributedDataParallel) else None)
        if inner is None:
            return module
        module = inner


def binding(module: Any, spec: ModelSpec) -> str:
    """How `module` takes `spec`'s inputs: KEYWORD or POSITIONAL (see the module docstring)."""
    fn = _innermost(module)
    fn = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or compiled callable without a signature
        return POSITIONAL
    names = [t.name for t in spec.inputs]
    named = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    takes_args = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [n for n, p in named.items() if p.default is p.empty]
    described = ", ".join(str(p) for p in params)
    unfed = [n for n in required if n not in names]
    if all(n in named for n in names) or takes_kwargs and (any(n in named for n in names) or not takes_args
                                                           and not unfed):
        if unfed:
            raise SignatureError(f"model {spec.name}: forward({described}) requires {unfed}, which the spec "
                                 f"does not name as inputs {names}")
        return KEYWORD
    if not named and takes_args:
        return POSITIONAL
    if len(names) == 1 and len(required) == 1 and not takes_args:
        return POSITIONAL  # one tensor for one parameter: nothing to confuse
    lacking = [n for n in names if n not in named]
    raise SignatureError(f"model {spec.name}: forward({described}) has no parameter for inputs {lacking}; name "
                         f"forward's parameters after the spec's inputs {names} (it is then called by keyword), "
                         f"or take `*inputs` to be called positionally in spec order")


def call(module: Any, spec: ModelSpec, inputs: Mapping[str, torch.Tensor], how: str | None = None) -> Any:
    """`module`'s raw result for `inputs` (keyed by input name), bound as `binding` says."""
    how = how or binding(module, spec)
    if how == KEYWORD:
        return module(**{t.name: inputs[t.name] for t in spec.inputs})
    return module(*(inputs[t.name] for t in spec.inputs))


def flatten(result: Any, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """A module's result as the spec's outputs by name (see the module docstring)."""
    return flatten_named(result, spec.name, tuple(t.name for t in spec.outputs))


def flatten_named(result: Any, model: str, names: Sequence[str]) -> dict[str, torch.Tensor]:
    names = list(names)
    if isinstance(result, torch.Tensor):
        if len(names) != 1:
            raise SignatureError(f"model {model} returned one tensor; its spec names {len(names)} outputs {names}: "
                                 f"return a tuple in that order or a dict keyed by those names")
        return {names[0]: result}
    named = _named(result)
    if named is not None:
        named = {k: v for k, v in named.items() if v is not None}
        missing = [n for n in names if n not in named]
        extra = sorted(set(named) - set(names))
        if missing or extra:
            raise SignatureError(f"model {model} returned outputs {sorted(named)}; its spec names {names}"
                                 + (f": {missing} missing" if missing else "")
                                 + (f"{';' if missing else ':'} {extra} not declared (declare them in the spec's "
                                    f"outputs or leave them out of the result)" if extra else ""))
        values = [named[n] for n in names]
    elif isinstance(result, (tuple, list)):
        if len(result) != len(names):
            raise SignatureError(f"model {model} returned {len(result)} outputs; its spec names {len(names)} {names}")
        values = list(result)
    else:
        raise SignatureError(f"model {model} returned a {type(result).__name__}; return a tensor, a tuple, or a "
                             f"dict keyed by the spec's output names {names}")
    for name, value in zip(names, values):
        if not isinstance(value, torch.Tensor):
            raise SignatureError(f"model {model}: output {name!r} is a {type(value).__name__}, not a tensor")
    return dict(zip(names, values))


def _named(result: Any) -> dict[str, Any] | None:
    """The outputs by name of a result that names them (dict, ModelOutput, named tuple,
    dataclass), or None for a plain tuple or list."""
    if isinstance(result, Mapping):  # dicts, and transformers' ModelOutput (an OrderedDict)
        return dict(result.items())
    if isinstance(result, tuple) and hasattr(result, "_fields"):
        return dict(zip(result._fields, result))
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    return None


class Signature(torch.nn.Module):
    """`module` as every exporter captures it: positional tensors in spec order in, a
    plain tuple in spec order out, whatever the module takes and returns."""

    def __init__(self, module: torch.nn.Module, spec: ModelSpec) -> None:
        super().__init__()
        self.module = module
        self.model = spec.name
        self.input_names = tuple(t.name for t in spec.inputs)
        self.output_names = tuple(t.name for t in spec.outputs)
        self.binding = binding(module, spec)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.binding == KEYWORD:
            result = self.module(**dict(zip(self.input_names, inputs)))
        else:
            result = self.module(*inputs)
        flat = flatten_named(result, self.model, self.output_names)
        return tuple(flat[n] for n in self.output_names)
