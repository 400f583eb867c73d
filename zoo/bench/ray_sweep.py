"""`zoo bench ... --ray ADDRESS`: the benchmark matrix as Ray tasks, over every machine of a cluster.

Each combination (export, then measure) is one Ray task in a worker process of its own
(`max_calls=1`: the worker exits after it, so no engine's thread pools, allocator or
compiled kernels carry into the next combination). Inside the task the export and the
measurement each run in a fresh child process, exactly as a local run does
(`zoo.bench.matrix.combination`; spawned rather than forked from a forkserver, which
hangs under a Ray worker), with the same per-process timeout; so a timed-out,
crashed or refused combination comes back as the same "failed", "refused" or
"unsupported" row, and
the rows merge into one report in the local run's order.

Resources: a CUDA combination asks for one GPU, so a sweep fans out over every GPU of the
cluster, one combination per GPU at a time. A CPU combination asks for `--threads` CPUs,
or by default every CPU of the largest node, so two CPU measurements never share a node's
cores (their timings would be each other's noise).

The artifact repository (`--repository`) is a path each worker writes and reads: on a
cluster of several machines put it on storage every node mounts, or each node exports
its own artifacts. Every node needs zoo and the plugins the sweep uses installed (or a
Ray `runtime_env`); a plugin file given with `--plugin` must be at the same path on every
node.

Every task also returns the environment of the node that ran it (`node_environment`: its
host name, CPU, GPU and library versions, and the thread settings Ray gave the task), read
there after the combination: each row names its `node`, the report lists every node's
environment under `environment.nodes`, and the report's own machine facts are the nodes'
(`cluster_environment`), not those of the driver, which measured nothing (a laptop, or a
head node without the workers' GPUs).

A combination that no live node of the cluster could take (a GPU where no node has one)
is a failed row at once, saying what the cluster lacks: Ray would keep its task pending
until such a node joins, and the sweep would wait for it in silence.

"local" starts a Ray instance on this machine for the run and stops it after; "auto"
joins the cluster this machine belongs to; "ray://HOST:PORT" connects a Ray client (its
server listens on 10001 by default) and "HOST:PORT" a head node's GCS (6379 by default).
Any other form is a usage error, and an address where nothing answers a TCP connection, or
gRPC's health check, within `PROBE_TIMEOUT` seconds an error, before `ray.init` (which would
retry for minutes).
An instance already started in this process (`ray.init` in a notebook or a test) is used as is
for "local", "auto" and its own address; another explicit address is a usage error.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from ..errors import UnsupportedError, UsageError, ZooError

FORMS = "local, auto, ray://HOST:PORT (a Ray client server) or HOST:PORT (a head node's GCS)"
PROBE_TIMEOUT = 5.0  # seconds a head node has to accept a TCP connection
_RESOURCE = {"num_cpus": "CPU", "num_gpus": "GPU"}  # ray.remote's argument: ray.nodes()'s resource name
#: what names a node in its environment (`node_environment`), rather than describing it
NODE_NAMES = ("hostname", "node_id", "ip")


def endpoint(address: str) -> tuple[str, int] | None:
    """The (host, port) `--ray ADDRESS` names; None for "local" and "auto", which name none.
    A usage error for a form `ray.init` does not take (or takes only to retry for minutes)."""
    if address in ("local", "auto"):
        return None
    inner = address.removeprefix("ray://")
    try:
        parts = urlsplit("//" + inner)
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, or out of range
        host = port = None
    if not host or port is None or parts.netloc != inner or "@" in inner:
        raise UsageError(f"--ray {address}: not a Ray address; give {FORMS}")
    return host, port


def _refuse_another_address(ray: Any, address: str) -> None:
    """An instance this process already uses (`ray.init` in a notebook) is used as is for
    "local" and "auto", and for the address it is connected to; another explicit address
    is refused, not silently swapped for it."""
    where = endpoint(address)
    if where is None:
        return
    client = ray.util.client.ray.is_connected()
    if client and address.startswith("ray://"):
        return  # a Ray client's server does not say which one it is: the user connected it
    current = None if client else ray.get_runtime_context().gcs_address
    if current is not None and not address.startswith("ray://"):
        host, _, port = current.rpartition(":")
        if int(port) == where[1] and _same_host(host, where[0]):
            return
    raise UsageError(f"--ray {address}: this process already uses the Ray instance at "
                     f"{'a Ray client server' if client else current} (`ray.init` was called before); "
                     f"call `ray.shutdown()` first to sweep on {address}, or pass --ray local to use the one it has")


def _same_host(a: str, b: str) -> bool:
    """Whether two host names or addresses name the same machine: the same address, or
    both addresses of this one (a socket binds to each)."""
    def local(ip: str) -> bool:
        try:
            with socket.socket() as s:
                s.bind((ip, 0))
            return True
        except OSError:
            return False

    try:
        ia, ib = socket.gethostbyname(a), socket.gethostbyname(b)
    except OSError:
        return False
    return ia == ib or (local(ia) and local(ib))


def check_reachable(address: str) -> None:
    """Refuse an address where nothing accepts a TCP connection, in `PROBE_TIMEOUT` seconds."""
    where = endpoint(address)
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=PROBE_TIMEOUT).close()
    except OSError as exc:
        raise ZooError(f"--ray {address}: nothing answers at {where[0]}:{where[1]} "
                       f"({exc.strerror or exc}); is Ray running there?") from None
    _check_grpc(address, where)


def _check_grpc(address: str, where: tuple[str, int]) -> None:
    """Refuse an address whose server does not answer gRPC, as a head node's GCS and a Ray
    client server do: `ray.init` would retry an HTTP server's port for minutes. Any answer
    to gRPC's health check will do (a GCS answers it; another gRPC server may not offer it)."""
    import grpc

    host = f"[{where[0]}]" if ":" in where[0] else where[0]
    with grpc.insecure_channel(f"{host}:{where[1]}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            check(b"", timeout=PROBE_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                detail = ((exc.details() or "").strip().splitlines() or [""])[0][:120]
                raise ZooError(f"--ray {address}: what answers at {where[0]}:{where[1]} does not speak gRPC "
                               f"({exc.code().name}: {detail}), as a Ray head node's GCS or a Ray client "
                               f"server does; is that Ray's port?") from None


def _ray():
    try:
        import ray
    except ImportError:
        raise UnsupportedError("--ray needs Ray: pip install 'zoo[ray]'") from None
    return ray


def _combination(job: dict[str, Any], timeout: float | None) -> tuple[str, Any, dict[str, Any]]:
    """The task body, in a Ray worker: the local run's own code, its processes spawned
    (a forkserver started from a Ray worker hangs its children), and the environment of
    the node it ran on, read after the combination (reading the GPU's name makes a CUDA
    context, which the worker should not hold while its child measures)."""
    from .matrix import combination

    status, payload = combination(job, timeout, start_method="spawn")
    return status, payload, node_environment(job.get("threads"))


def node_environment(threads: int | None) -> dict[str, Any]:
    """This node's environment, as a local run records its own machine's (`environment`),
    named by host name, Ray node id and address; not the driver's command line (a Ray
    worker's). A node whose facts cannot be read says why, and its rows still count."""
    import ray

    from .env import environment

    names = {"hostname": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id(),
             "ip": ray.util.get_node_ip_address()}
    try:
        env = environment(threads)
    except Exception as exc:  # the facts are a report's notes: a measured row is not lost for them
        return {**names, "error": f"the environment could not be read: {type(exc).__name__}: {exc}"}
    env.pop("command", None)
    return {**names, **env}


def _node_name(nodes: dict[str, dict[str, Any]], env: dict[str, Any]) -> str:
    """The name `env`'s node goes by in the report (its host name; with its address where
    another node has that host name too), its environment added to `nodes` under it. A
    node's later tasks only add what its first did not see (a GPU hidden from a CPU task)."""
    name = str(env.get("hostname") or env.get("ip") or "unknown")
    if name in nodes and nodes[name].get("node_id") != env.get("node_id"):
        name = f"{name} ({env.get('ip') or env.get('node_id')})"
    for key, value in env.items():
        nodes.setdefault(name, {}).setdefault(key, value)
    return name


def cluster_environment(driver: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A Ray sweep's report environment: the driver's command, with each machine fact
    (CPU, cores, GPU, threads, library versions) the nodes' that measured, one value where
    they agree and "NODE: value; ..." where they differ, and every node's own under "nodes".
    The driver's own facts stand only where no task ran on any node (nothing was measured).
    `--compare` compares these facts as it compares a local run's."""
    if not nodes:
        return {**driver, "nodes": {}}
    env: dict[str, Any] = {"command": driver.get("command")}
    own = {*NODE_NAMES, "libraries", "error"}  # a node's name, and why its facts are missing, stay its own
    keys = dict.fromkeys(k for facts in nodes.values() for k in facts if k not in own)
    for key in keys:
        values = {name: facts[key] for name, facts in sorted(nodes.items()) if key in facts}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) == 1:
            env[key] = next(iter(values.values()))
        else:
            env[key] = "; ".join(f"{name}: {json.dumps(v, sort_keys=True) if isinstance(v, dict) else v}"
                                 for name, v in values.items())
    env["libraries"] = sorted({lib for facts in nodes.values() for lib in facts.get("libraries") or ()})
    return {**env, "nodes": nodes}


def _resources(ray, job: dict[str, Any]) -> dict[str, float]:
    """What one combination's task asks Ray for. The CPUs are counted on the cluster's
    nodes, not on this (driver's) machine, which may be a laptop or a head node unlike
    the workers: a whole node's by default, `--threads` where given (at most a node's)."""
    if str(job["device"]).startswith("cuda"):
        return {"num_gpus": 1, "num_cpus": 1}
    largest = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=1)
    return {"num_cpus": max(1, min(job.get("threads") or largest, largest))}


def _lacking(nodes: Sequence[dict[str, Any]], asked: dict[str, float]) -> str | None:
    """Why no live node can take a task asking for `asked`; None when one can. (Ray would
    keep such a task pending, with no error, until a node that has them joins.)"""
    wanted = {_RESOURCE[k]: v for k, v in asked.items()}
    live = [n["Resources"] for n in nodes if n.get("Alive")]
    if any(all(r.get(name, 0) >= v for name, v in wanted.items()) for r in live):
        return None
    if wanted.get("GPU") and not any(r.get("GPU", 0) for r in live):
        return "no live node of the Ray cluster has a GPU"
    return "no live node of the Ray cluster has " + " and ".join(f"{v:g} {name}" for name, v in wanted.items())


TERMINATED = 128 + signal.SIGTERM  # the exit status a shell reports for a process SIGTERM ended


def _exit_on_sigterm(signum, frame):
    raise SystemExit(TERMINATED)


def run_on_ray(jobs: Sequence[dict[str, Any] | None], timeout: float | None, address: str,
               nodes: dict[str, dict[str, Any]] | None = None) -> Iterator[Any]:
    """Submit every job (None: a hole, answered None), then yield each outcome in order:
    (status, payload, node) for one a node ran, node the name it has in `nodes`, where its
    environment is added (`_node_name`); (status, reason) for one no node ran or returned."""
    nodes = {} if nodes is None else nodes
    ray = _ray()
    started = False
    if ray.is_initialized():
        _refuse_another_address(ray, address)
    else:
        check_reachable(address)
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            what = "cannot start Ray" if address == "local" else "cannot reach Ray"
            hint = "; --ray local starts one on this machine" if address == "auto" else ""
            raise ZooError(f"--ray {address}: {what}: {str(exc).rstrip('.')}{hint}") from None
        started = True
    # Ray's core worker replaces Python's SIGTERM handler with absl's, which dumps a stack
    # and aborts, leaving this Ray instance's processes behind: exit through `finally` instead
    terminable = started and threading.current_thread() is threading.main_thread()
    if terminable:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        remote = ray.remote(max_calls=1, max_retries=0)(_combination)
        # a backstop for a task that never returns (its node lost): two processes' timeouts, and a minute
        limit = None if timeout is None else 2 * timeout + 60
        cluster = ray.nodes()
        refs: list[Any] = []  # per job: None (a hole), a failed outcome (no node could run it), or its task
        for job in jobs:
            if job is None:
                refs.append(None)
                continue
            asked = _resources(ray, job)
            lacking = _lacking(cluster, asked)
            refs.append(("failed", lacking) if lacking else remote.options(**asked).remote(job, timeout))
        for ref in refs:
            if ref is None or isinstance(ref, tuple):
                yield ref
                continue
            try:
                status, payload, env = ray.get(ref, timeout=limit)
            except SystemExit:  # SIGTERM while waiting: `ray.get` re-raises the handler's exit as status 1
                raise SystemExit(TERMINATED) from None
            except ray.exceptions.GetTimeoutError:
                ray.cancel(ref, force=True)
                yield "failed", f"timed out after {limit:g} s on Ray"
            except ray.exceptions.RayError as exc:  # the worker died, the node was lost, the task failed
                yield "failed", f"the Ray task failed: {str(exc).strip().splitlines()[-1][:300]}"
            else:
                yield status, payload, _node_name(nodes, env)
    finally:
        if started:
            ray.shutdown()
        if terminable:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
