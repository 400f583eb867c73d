"""Checks of the arguments that several public functions take alike: a device name, a
thread count, domain-native items. Each is a typed error naming the bad value before any
work, never a library's own error from deep inside it (or, worse, no error at all).

No deep-learning library is imported here: `zoo.load` and `zoo.Client` use these.
"""

from __future__ import annotations

import numbers
import re
from typing import Any

from .errors import InputError, UsageError

DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def check_device(device: Any) -> str:
    """`device` when it names a device the zoo runs on: "cpu", "cuda" or "cuda:N"."""
    if not isinstance(device, str) or not DEVICE.fullmatch(device):
        raise UsageError(f"unknown device {device!r}: cpu or cuda[:N]")
    return device


def check_threads(threads: Any) -> int | None:
    """`threads` as an int when it is a positive integer; None (the library's default) as is."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise UsageError(f"threads must be a positive integer or None, got {threads!r}")
    return int(threads)


def domain_items(items: Any) -> list[bytes]:
    """Domain-native items (texts, SMILES, encoded images) as the bytes a spec's
    preprocessing takes. A lone str or bytes is one item, not a sequence of characters
    or bytes (as a transformers pipeline takes one text); anything but str or bytes-like
    items is an `InputError` naming it, never a buffer of zeros made from an int."""
    if isinstance(items, (str, bytes, bytearray, memoryview)):
        items = [items]
    try:
        items = list(items)
    except TypeError:
        raise InputError(f"items is a list of str or bytes inputs, not {type(items).__name__}") from None
    raw = []
    for k, item in enumerate(items, 1):
        if isinstance(item, str):
            try:  # a lone surrogate: bytes no UTF-8 decodes (a command-line argument's, say)
                raw.append(item.encode())
            except UnicodeEncodeError:
                raise InputError(f"item {k} is not valid UTF-8") from None
        elif isinstance(item, (bytes, bytearray, memoryview)):
            raw.append(bytes(item))
        else:
            raise InputError(f"item {k} is {type(item).__name__}, not str or bytes")
    return raw


def check_text_items(kind: str, items: list[bytes]) -> list[bytes]:
    """Text items (a kind that is not binary) as UTF-8, each that is not named before the
    plugin's preprocess sees it: as the server answers, so `zoo predict` does."""
    for k, item in enumerate(items, 1):
        try:
            item.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{kind} item {k} is not valid UTF-8") from None
    return items
