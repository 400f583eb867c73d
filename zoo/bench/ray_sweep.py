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

"local" starts a Ray instance on this machine for the run and stops it after; "auto"
joins the cluster this machine belongs to; "ray://HOST:10001" connects a Ray client. An
instance already started in this process (`ray.init` in a notebook or a test) is used as is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import UnsupportedError, ZooError


def _ray():
    try:
        import ray
    except ImportError:
        raise UnsupportedError("--ray needs Ray: pip install 'zoo[ray]'") from None
    return ray


def _combination(job: dict[str, Any], timeout: float | None) -> tuple[str, Any]:
    """The task body, in a Ray worker: the local run's own code, its processes spawned
    (a forkserver started from a Ray worker hangs its children)."""
    from .matrix import combination

    return combination(job, timeout, start_method="spawn")


def _resources(ray, job: dict[str, Any]) -> dict[str, float]:
    """What one combination's task asks Ray for. The CPUs are counted on the cluster's
    nodes, not on this (driver's) machine, which may be a laptop or a head node unlike
    the workers: a whole node's by default, `--threads` where given (at most a node's)."""
    if str(job["device"]).startswith("cuda"):
        return {"num_gpus": 1, "num_cpus": 1}
    largest = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=1)
    return {"num_cpus": max(1, min(job.get("threads") or largest, largest))}


def run_on_ray(jobs: Sequence[dict[str, Any] | None], timeout: float | None, address: str) -> Iterator[Any]:
    """Submit every job (None: a hole, answered None), then yield each outcome in order."""
    ray = _ray()
    started = False
    if not ray.is_initialized():
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise ZooError(f"--ray {address}: cannot start or reach Ray: {exc}") from None
        started = True
    try:
        remote = ray.remote(max_calls=1, max_retries=0)(_combination)
        # a backstop for a task that never returns (its node lost): two processes' timeouts, and a minute
        limit = None if timeout is None else 2 * timeout + 60
        refs = [None if job is None else remote.options(**_resources(ray, job)).remote(job, timeout)
                for job in jobs]
        for ref in refs:
            if ref is None:
                yield None
                continue
            try:
                yield ray.get(ref, timeout=limit)
            except ray.exceptions.GetTimeoutError:
                ray.cancel(ref, force=True)
                yield "failed", f"timed out after {limit:g} s on Ray"
            except ray.exceptions.RayError as exc:  # the worker died, the node was lost, the task failed
                yield "failed", f"the Ray task failed: {str(exc).strip().splitlines()[-1][:300]}"
    finally:
        if started:
            ray.shutdown()
