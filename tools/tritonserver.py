"""Start the real NVIDIA Triton server that `scripts/triton_setup.sh` lays out (`make triton`),
or run its perf_analyzer (`perf_analyzer(args)`).

    with Tritonserver(Path("exports")) as triton:
        tritonclient.http.InferenceServerClient(triton.http_url) ...

The server listens on 127.0.0.1 only, on free ports, with model control explicit when
`models` is given (only those load) and none otherwise (every model of the repository).
Python-backend models run in `$TRITON_HOME/env` (numpy<2, then the project's packages):
its `bin` is put first on PATH, since Triton's Python stub takes its packages from the
prefix of the `python3` first on PATH. The bundled libraries and this interpreter's
LIBDIR (the stub links libpython) go on LD_LIBRARY_PATH.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Sequence

import httpx

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HOME = ROOT / ".triton"


def triton_home() -> Path:
    return Path(os.environ.get("TRITON_HOME", DEFAULT_HOME))


def unavailable_reason(home: Path | None = None) -> str | None:
    """Why the server cannot start here, or None."""
    home = home or triton_home()
    for part in ("bin/tritonserver", "backends/python/triton_python_backend_stub", "env/bin/python3"):
        if not (home / part).exists():
            return f"no {home / part}: run `make triton` (scripts/triton_setup.sh)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tritonserver:
    def __init__(self, repository: Path, models: Sequence[str] | None = None, log: Path | None = None,
                 home: Path | None = None, args: Sequence[str] = (), http_port: int | None = None,
                 grpc_port: int | None = None) -> None:
        self.home = home or triton_home()
        reason = unavailable_reason(self.home)
        if reason:
            raise RuntimeError(reason)
        self.http_port, self.grpc_port = http_port or free_port(), grpc_port or free_port()
        self.http_url = f"127.0.0.1:{self.http_port}"  # tritonclient takes HOST:PORT
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.log_path = log or Path(os.devnull)
        control = ["--model-control-mode", "explicit", *(f"--load-model={m}" for m in models)] if models else []
        env = dict(os.environ)
        env["PATH"] = f"{self.home / 'env' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        libdir = sysconfig.get_config_var("LIBDIR") or str(Path(sys.base_prefix) / "lib")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(self.home / "lib"), libdir, env.get("LD_LIBRARY_PATH", "")) if p)
        for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "ZOO_PLUGINS"):
            env.pop(key, None)
        cmd = [str(self.home / "bin" / "tritonserver"), "--model-repository", str(repository),
               "--backend-directory", str(self.home / "backends"),
               "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
               "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
               "--allow-metrics", "false", "--strict-readiness", "false", "--exit-timeout-secs", "10",
               "--exit-on-error", "false",
               *control, *args]
        self._out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def wait_live(self, timeout: float = 300.0) -> "Tritonserver":
        """Until the HTTP endpoint answers and no model is still loading.

        The answer must be this process's: another server on the port (a `zoo serve`) answers
        /v2/health/live too, while tritonserver fails with "Socket already in use". So the
        process must be alive and the server metadata must name Triton."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_running()
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"http://{self.http_url}/v2/health/live", timeout=2).status_code == 200:
                    name = httpx.get(f"http://{self.http_url}/v2", timeout=2).json().get("name")
                    self._check_running()
                    if name != "triton":
                        self.stop()
                        raise RuntimeError(f"the server answering on {self.http_url} is {name!r}, not Triton "
                                           f"(is the port taken?):\n{self._log_tail()}")
                    index = httpx.post(f"http://{self.http_url}/v2/repository/index", json={}, timeout=5).json()
                    if all(m.get("state") not in ("LOADING", "UNLOADING") for m in index):
                        return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"tritonserver was not ready after {timeout} s:\n{self._log_tail()}")

    def _check_running(self) -> None:
        if self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"tritonserver exited with {self.proc.returncode}:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 40) -> str:
        if self.log_path == Path(os.devnull):
            return "(its log was discarded: give log= or --log FILE to keep it)"
        return "\n".join(self.log().splitlines()[-lines:])

    def index(self) -> dict[str, dict]:
        """The repository index by model name: state and reason."""
        return {m["name"]: m for m in httpx.post(f"http://{self.http_url}/v2/repository/index", json={},
                                                 timeout=10).json()}

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def rss_bytes(self) -> int:
        """Resident memory of the server and its Python stubs (children)."""
        total = 0
        for pid in [self.proc.pid, *children(self.proc.pid)]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stubs left behind
        self._out.close()

    def __enter__(self) -> "Tritonserver":
        return self.wait_live()

    def __exit__(self, *exc) -> None:
        self.stop()


def perf_analyzer(args: Sequence[str], home: Path | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run Triton's perf_analyzer (2.51, laid out by `make triton`) with `args`; its libb64
    and libcudart are the server's bundled ones. Output as text, stdout and stderr merged."""
    home = home or triton_home()
    binary = home / "bin" / "perf_analyzer"
    if not binary.exists():
        raise RuntimeError(f"no {binary}: run `make triton` (scripts/triton_setup.sh)")
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(
        p for p in (str(home / "lib"), os.environ.get("LD_LIBRARY_PATH", "")) if p)}
    return subprocess.run([str(binary), *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found += [int(entry.name), *children(int(entry.name))]
    return found


def main() -> None:
    """Serve REPOSITORY with the real NVIDIA Triton server that `make triton` lays out, printing each
    model's state, until Ctrl-C, SIGTERM or SIGHUP; then stop tritonserver and its Python stubs
    (docs/deploy.md)."""
    import argparse

    parser = argparse.ArgumentParser(description=" ".join(main.__doc__.split()))
    parser.add_argument("repository", type=Path)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--log", type=Path, default=None, help="Triton's log file (default: a temporary file, "
                        "whose last lines a failed start shows)")
    ns = parser.parse_args()
    if ns.log is None:
        import tempfile

        fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
        os.close(fd)
        ns.log = Path(name)
    # tritonserver runs in its own session (start_new_session): neither Ctrl-C nor a signal to
    # this process reaches it or its Python stubs. SIGTERM (a supervisor, `kill`, a container
    # stop) and SIGHUP (the terminal closed) end this process as Ctrl-C does, through the
    # `finally` that stops the server, as do they while it is still starting.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    server = None
    try:
        try:
            server = Tritonserver(ns.repository.resolve(), log=ns.log, http_port=ns.http_port,
                                  grpc_port=ns.grpc_port)
            server.wait_live()
        except RuntimeError as exc:
            sys.exit(f"error: {exc}")
        log = server.log()
        for name, entry in sorted(server.index().items()):
            print(f"{name}: {index_line(entry, log)}", flush=True)
        print(f"Triton serving {ns.repository} on http://{server.http_url} and grpc {server.grpc_url}; Ctrl-C stops",
              flush=True)
        while server.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        if server is not None:
            server.stop()


def index_line(entry: dict, log: str) -> str:
    """A repository index entry as "STATE REASON". A directory Triton could not read as a model
    (no configuration it can complete, a configuration naming another model) has no state in the
    index: its reason is in the log's "Poll failed for model directory" line."""
    if entry.get("state"):
        return f"{entry['state']} {entry.get('reason', '')}".rstrip()
    prefix = f"Poll failed for model directory '{entry['name']}': "
    reason = next((line.split(prefix, 1)[1].rstrip('"') for line in log.splitlines() if prefix in line),
                  "see Triton's log (--log)")
    return f"not a model Triton can load: {reason}"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


if __name__ == "__main__":
    main()
