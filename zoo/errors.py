"""Typed errors. Every failure a user can cause is one of these, with a message that
says what was wrong and what to do; the CLI prints the message and exits non-zero,
never a traceback (see ``zoo.cli``)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from typing import Iterator


def debugging() -> bool:
    """ZOO_DEBUG set to anything but empty, 0, false, no or off: tracebacks and the
    libraries' own output are shown. `ZOO_DEBUG=0` turned it on."""
    return os.environ.get("ZOO_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


class ZooError(Exception):
    """Base class: a user-facing failure with a complete, actionable message."""

    exit_code = 1


class UsageError(ZooError):
    """The command line asks for something no run can do: options that do not go
    together, a value out of range. Exit status 2, as a command-line parser's errors."""

    exit_code = 2


class PluginError(ZooError):
    """A plugin is broken: an unknown hook, a duplicate name, a file that fails to load."""


class UnknownModelError(ZooError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownBackendError(ZooError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class BackendUnavailableError(ZooError):
    """The backend is registered but cannot run here (library missing, no device)."""


class UnsupportedError(ZooError):
    """A precision or device the backend (or the device) does not support."""


class SpecError(ZooError):
    """A model does not do what its spec says (an output's name, dtype or shape, a sample
    that ignores its batch size, non-finite outputs): `zoo check` lists every departure,
    one per line, and `zoo export` refuses with the same lines before any backend work."""


class ExportError(ZooError):
    """The model could not be converted to the backend's format."""


class SignatureError(ZooError):
    """A module does not fit its spec's signature: a forward that cannot be bound to the
    spec's inputs by name, or a result whose outputs do not match the spec's names."""


class CheckpointError(ZooError):
    """A checkpoint is missing, corrupted, or belongs to another model."""


class ArtifactError(ZooError):
    """An artifact directory is incomplete, corrupted or modified, or unsafe to load (without a
    signature, `zoo.signing`, a file changed together with its hash in the manifest is not seen)."""


class StaleArtifactError(ArtifactError):
    """An artifact built with other library versions or for another device."""


class PluginNotLoadedError(ZooError):
    """An artifact runs without the plugin that defined its model, but this needs it
    (building the PyTorch module, domain-native inputs): the message says what to install."""


class VerificationError(ZooError):
    """An export does not reproduce the PyTorch reference; no artifact is written."""


class ShapeError(VerificationError):
    """Output names or shapes differ from the reference."""


class ToleranceError(VerificationError):
    """Output values differ from the reference beyond the spec's tolerance."""


class InputError(ZooError):
    """A request's inputs are wrong: a bad name, shape or dtype, an invalid SMILES,
    text that is not UTF-8, an image that does not decode. The message names the item."""

    def in_chunk(self, start: int, size: int, total: int) -> "InputError":
        """This error, raised for items[start:start + size] of `total`, saying which input
        its item numbers (counted within the chunk, from 1) start at, and which input the
        item it names is; unchanged for the first chunk."""
        if not start:
            return self
        end = min(start + size, total)
        named = {int(n) for n in re.findall(r"\bitem (\d+)\b", str(self))}
        so = ""
        if len(named) == 1 and 1 < (n := named.pop()) <= end - start:  # one item named: say which input it is
            so = f", so item {n} is input {start + n}"
        return InputError(f"{self} (among inputs {start + 1} to {end} of {total}: item 1 is input {start + 1}){so}")


class NoInputsError(InputError, UsageError):
    """No items to predict on: an InputError to a caller of `predict` or `Client.predict`,
    and to the command line a usage error (exit status 2), as a missing argument is."""


class SettingError(InputError, UsageError):
    """A setting of `predict` or `generate` no run can use (max_new_tokens 0, a negative
    temperature or seed): an InputError to a library caller, exit status 2 on the command line."""


def first_line(exc: BaseException) -> str:
    """The gist of a library error: its first non-empty line, without the traceback; where
    that line only introduces the next ("backend='inductor' raised:"), both."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def signal_name(returncode: int | None) -> str | None:
    """The signal a child process's negative exit code means ("SIGSEGV": a native library's
    crash), or None for an ordinary exit."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt (`zoo` commands install it):
    whatever stops cleanly on Ctrl-C (a staging directory removed, a partial report
    written) stops so on SIGTERM, which a time-out, CI or a container's stop sends. Exit
    status 143 (128 + SIGTERM)."""

    exit_code = 128 + signal.SIGTERM


_terminated: list[int] = []


def raise_on_sigterm() -> None:
    """Make SIGTERM raise `Terminated` in the main thread from now on."""
    def terminated(signum, frame):
        _terminated.append(signum)
        raise Terminated()
    signal.signal(signal.SIGTERM, terminated)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held while a native library is imported, and handled once it is:
    their handlers raise KeyboardInterrupt / `Terminated` in the Python code that runs next,
    and raised inside an extension module's initialization (onnx's, which runs Python code
    as it builds itself) they crashed the process (SIGSEGV, SIGABRT) instead of stopping it,
    its staging directory left behind. Held in Python, by a handler that only records the
    signal (blocking it in this thread is not enough: another thread, torch's, takes it);
    only in the main thread, where Python runs handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(pending):  # as it would have been handled, now
            if callable(handler := previous[s]):
                handler(s, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(s)


def was_terminated() -> bool:
    """Whether SIGTERM came (`raise_on_sigterm`): click turns every KeyboardInterrupt,
    `Terminated` too, into exit status 130, which this tells apart."""
    return bool(_terminated)

