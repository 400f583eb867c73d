"""Dynamic batching: requests queued for a model are merged into one execution.

The policy is Triton's dynamic batcher (model configuration `dynamic_batching`,
`GetDynamicBatch`), on rows: queued requests join the oldest in order; a batch goes to a
free instance at once when it can form a preferred batch size (the largest one; that
many rows are sent and the rest wait), when it reaches the largest preferred size (the
maximum batch size without preferred sizes) or cannot grow (the next request does not
fit, or cannot join it), and otherwise when its oldest request has waited
`max_queue_delay` (then all that fit are sent); while every instance is busy, requests
keep arriving and the next batch grows. The
queue is bounded: a request that finds it full is refused at once (503) rather than
waiting without limit.

Ragged batching: requests whose dynamic non-batch axes differ (sequence lengths, atom
counts) are padded with zeros on the right to the longest in their execution, and each
request's outputs are sliced back to its own sizes on the output axes of the same
symbolic name. A batch whose sizes spread widely runs as a few executions of requests of
similar sizes (`padding_groups`), so that short requests do not pay for the longest. Zoo
models with such axes take masks, so padding does not change a request's result beyond
the model's fp32 tolerance (the plugins' tests check this).

Side inputs: an input without the batch axis applies to every row of its request (a
per-request setting next to batched data). Such requests are batched along the batch
axis of their other inputs, and only with requests whose side inputs are identical.

Fault isolation: when a batch fails, the runner is first asked a known-good request (the
last one it answered, else the model's own sample). If it answers, the runner is sound
and the batch is bisected until the requests that fail alone are found: those get a
`RequestFailedError` (400), every other request its answer. Only when the known-good
request fails too is it a backend fault: the batch's requests get 500 and the model
recovers (`on_failure`).

Runners execute in worker threads, one per instance; the event loop never blocks on a
model.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ..arrays import to_numpy
from .errors import BackendFailureError, ModelNotReadyError, QueueFullError, RequestFailedError, engine_reason

log = logging.getLogger("zoo.serve")
Result = dict[str, np.ndarray] | BaseException  # one request's outputs, or the error it alone causes


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int  # largest number of rows (batch entries) in one execution
    max_queue_delay: float = 0.001  # seconds the oldest request may wait for others to join
    preferred_batch_sizes: tuple[int, ...] = ()  # batch sizes sent at once (`Batcher._select`)
    max_queue_size: int = 256  # requests waiting for an instance; more are refused with 503
    instances: int = 1  # concurrent executions (worker threads, one runner each)
    batching: bool = True  # False: every request executes alone, as sent
    ragged: bool = True  # False: only requests of identical shapes are batched together
    #: a ragged batch runs as one execution per group of requests whose padding stays within
    #: this fraction of their real elements (`padding_groups`); None: always one execution
    max_padding: float | None = 0.25

    def to_json(self) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size, "max_queue_delay_ms": self.max_queue_delay * 1e3,
                "preferred_batch_sizes": list(self.preferred_batch_sizes), "max_queue_size": self.max_queue_size,
                "instances": self.instances, "dynamic_batching": self.batching, "ragged": self.ragged,
                "max_padding": self.max_padding}


@dataclass(eq=False)
class Work:
    """One request's tensors on their way through the queue."""

    inputs: dict[str, np.ndarray]
    rows: int  # size of the batch axis in this request
    sizes: dict[str, int]  # this request's size of each dynamic non-batch axis
    future: asyncio.Future
    side: bytes = b""  # digest of the side inputs (no batch axis): only equal ones share a batch
    enqueued: float = field(default_factory=time.perf_counter)
    started: float = 0.0  # when its batch began executing
    compute: float = 0.0  # seconds its batch spent in the runner
    compute_input: float = 0.0  # seconds its batch spent being merged (padding, concatenation)
    compute_output: float = 0.0  # seconds its batch's outputs took to be split back per request

    @property
    def key(self) -> tuple:
        return tuple(sorted(self.sizes.items()))


def merge(works: Sequence[Work], names: Sequence[str], side: Collection[str] = ()) -> dict[str, np.ndarray]:
    """One batch from several requests, zero-padding every non-batch axis to the longest;
    side inputs (equal in every request of a batch) are passed once."""
    merged = {}
    for name in names:
        arrays = [w.inputs[name] for w in works]
        if len(arrays) == 1 or name in side:
            merged[name] = arrays[0]
        elif all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
            merged[name] = np.concatenate(arrays)
        else:
            tail = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
            out = np.zeros((sum(a.shape[0] for a in arrays), *tail), dtype=arrays[0].dtype)
            row = 0
            for a in arrays:
                out[(slice(row, row + a.shape[0]), *(slice(0, n) for n in a.shape[1:]))] = a
                row += a.shape[0]
            merged[name] = out
    return merged


def padding_groups(works: Sequence[Work], max_padding: float | None) -> list[list[int]]:
    """The indices of `works` in groups that each run as one execution.

    Padding a ragged batch to its longest request costs every shorter one the difference,
    and a transformer's cost grows with the padded length: sixteen sentences of 8 to 40
    tokens padded to 40 compute about twice the tokens they hold. So requests are taken in
    order of size and a group is closed when the next one would make the group's padded
    elements (rows x the longest size on every dynamic axis) exceed its real elements by
    more than `max_padding`; a batch of equal shapes stays one group. Triton's Python
    backend model (`zoo.triton_backend`) runs each distinct shape alone, the limit 0."""
    if max_padding is None or len(works) < 2 or len({w.key for w in works}) == 1:
        return [list(range(len(works)))]
    order = sorted(range(len(works)), key=lambda i: works[i].key)
    groups: list[list[int]] = []
    real = rows = 0  # the open group's real elements and rows
    longest: dict[str, int] = {}  # and its longest size on each axis
    for i in order:
        w = works[i]
        volume = math.prod(w.sizes.values())
        if groups:
            grown = {axis: max(longest.get(axis, 0), n) for axis, n in w.sizes.items()}
            if (rows + w.rows) * math.prod(grown.values()) <= (1 + max_padding) * (real + w.rows * volume):
                groups[-1].append(i)
                real, rows, longest = real + w.rows * volume, rows + w.rows, grown
                continue
        groups.append([i])
        real, rows, longest = w.rows * volume, w.rows, dict(w.sizes)
    return groups


def split(outputs: Mapping[str, np.ndarray], works: Sequence[Work],
          ragged_dims: Mapping[str, Mapping[int, str]]) -> list[dict[str, np.ndarray]]:
    """Each request's rows of the batch outputs, cut back to its own axis sizes."""
    if len(works) == 1:  # nothing was merged or padded: the outputs are the request's own
        return [dict(outputs)]
    results, row = [], 0
    for w in works:
        mine = {}
        for name, array in outputs.items():
            dims = ragged_dims.get(name, {})
            index = [slice(row, row + w.rows)]
            index += [slice(0, w.sizes[dims[d]]) if dims.get(d) in w.sizes else slice(None)
                      for d in range(1, array.ndim)]
            mine[name] = array[tuple(index)].copy()
        results.append(mine)
        row += w.rows
    return results


class Batcher:
    """The queue and the executions of one model."""

    def __init__(self, name: str, runners: Sequence[Callable], policy: BatchPolicy, input_names: Sequence[str],
                 ragged_dims: Mapping[str, Mapping[int, str]], known_good: Callable[[], dict[str, np.ndarray]],
                 side_inputs: Collection[str] = (),
                 on_batch: Callable[[Sequence[Work], int], None] = lambda works, rows: None,
                 on_failure: Callable[[BaseException], None] = lambda exc: None) -> None:
        self.name, self.policy = name, policy
        self.input_names, self.ragged_dims, self.side_inputs = tuple(input_names), ragged_dims, frozenset(side_inputs)
        self.on_batch, self.on_failure = on_batch, on_failure
        self._known_good = known_good  # inputs some runner of this model answered: the health probe
        self._pool: queue.SimpleQueue = queue.SimpleQueue()
        self.swap(runners)
        self._queue: collections.deque[Work] = collections.deque()
        self._arrived = asyncio.Event()
        self._slots = asyncio.Semaphore(policy.instances)
        self._running: set[asyncio.Task] = set()
        self._executor = ThreadPoolExecutor(policy.instances, thread_name_prefix=f"zoo-{name}")
        self._closed = False
        self.loop = asyncio.get_running_loop()
        self._collector = self.loop.create_task(self._collect())

    @property
    def depth(self) -> int:
        return len(self._queue)

    def swap(self, runners: Sequence[Callable]) -> None:
        """Use fresh runners from now on (after a failure); executions in flight finish on the old."""
        pool: queue.SimpleQueue = queue.SimpleQueue()
        for r in runners:
            pool.put(r)
        self._pool = pool

    def submit(self, work: Work) -> asyncio.Future:
        if self._closed:
            raise ModelNotReadyError(f"model {self.name} is shutting down")
        if len(self._queue) >= self.policy.max_queue_size:  # requests that timed out waiting hold no place
            self._queue = collections.deque(w for w in self._queue if not w.future.done())
        if len(self._queue) >= self.policy.max_queue_size:
            raise QueueFullError(f"model {self.name} has {len(self._queue)} requests queued, its limit; retry later")
        self._queue.append(work)
        self._arrived.set()
        return work.future

    def abandoned(self) -> None:
        """A queued request timed out or was cancelled: the batch it held back (a batch
        waiting for a preferred size, say) is formed again without it, as Triton does."""
        self._arrived.set()

    async def stop(self, timeout: float) -> None:
        """Refuse new requests, finish the queued and running ones (up to `timeout` s), stop."""
        self._closed = True
        deadline = time.monotonic() + timeout
        while (self._queue or self._running) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._collector.cancel()
        for w in self._queue:
            if not w.future.done():
                w.future.set_exception(ModelNotReadyError(f"model {self.name} stopped before running the request"))
        self._queue.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        # the runners go now (an execution still running holds its own): their engines' memory
        # is freed with them, not whenever the cycle collector reaches this batcher
        self._pool = queue.SimpleQueue()

    async def _collect(self) -> None:
        while True:
            await self._slots.acquire()  # batches form while every instance is busy
            try:
                works = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            task = self.loop.create_task(self._execute(works))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[Work]:
        p = self.policy
        while True:
            while self._queue and self._queue[0].future.done():  # abandoned (timed out) requests
                self._queue.popleft()
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            now = time.perf_counter()
            deadline = self._queue[0].enqueued + p.max_queue_delay
            works = self._select(p.max_queue_delay > 0 and now >= deadline)
            if works is not None:
                taken = {id(w) for w in works}
                self._queue = collections.deque(w for w in self._queue if id(w) not in taken)
                return works
            self._arrived.clear()
            # a timer that sets the event, not asyncio.wait_for (a task per wait)
            wake = self.loop.call_later(deadline - now, self._arrived.set)
            try:
                await self._arrived.wait()
            finally:
                wake.cancel()

    def _select(self, delay_exceeded: bool) -> list[Work] | None:
        """The batch to send now, or None to wait for more requests: Triton's
        `DynamicBatchScheduler::GetDynamicBatch`, on rows (a request may carry several).
        Queued requests join the oldest in order while they fit `max_batch_size`, up to
        the first that cannot join it (another shape without ragged batching, other side
        inputs): the batch cannot grow past that one, and answers keep the queue's order.
        Sent at once: the largest preferred size formed (else, where the next request
        would pass the largest preferred size, what came before it), unless the oldest
        request has waited the queue delay, which sends all; and a batch that cannot
        grow, reaches the largest preferred size (the maximum without preferred sizes)
        or has no queue delay to wait."""
        p = self.policy
        first = self._queue[0]
        if not p.batching:
            return [first]
        most = max(p.preferred_batch_sizes, default=p.max_batch_size)
        works: list[Work] = []
        rows, best, saturated = 0, 0, False  # best: how many requests make the batch to send, 0: none yet
        for w in self._queue:
            if w.future.done():
                continue
            if works:
                if rows + w.rows > most and not best:
                    best = len(works)
                if rows + w.rows > p.max_batch_size or w.side != first.side \
                        or (not p.ragged and w.key != first.key):
                    saturated = True
                    break
            works.append(w)
            rows += w.rows
            if rows in p.preferred_batch_sizes:
                best = len(works)
        if best and not delay_exceeded:
            return works[:best]
        if saturated or rows >= most or delay_exceeded or p.max_queue_delay <= 0:
            return works
        return None

    async def _execute(self, works: list[Work]) -> None:
        start = time.perf_counter()
        rows = sum(w.rows for w in works)
        for w in works:
            w.started = start
        try:
            results, executions, fault = await self.loop.run_in_executor(self._executor, self._run, works)
        except Exception as exc:  # merging or splitting broke: a server bug, never the client's
            log.error("model %s: batch of %d could not be executed: %s", self.name, rows, exc, exc_info=exc)
            results, executions, fault = [exc] * len(works), [], exc
        finally:
            self._slots.release()
        if fault is not None:
            log.error("model %s failed on a batch of %d and on a known-good request: %s", self.name, rows, fault,
                      exc_info=fault)
        for group, clock in executions:  # each padding group ran as an execution of its own
            for i in group:
                works[i].compute_input, works[i].compute, works[i].compute_output = clock
        refused = 0
        for w, result in zip(works, results):
            if isinstance(result, BaseException):
                result = self._failure(result, fault)
                refused += 1
            if not w.future.done():
                if isinstance(result, BaseException):
                    w.future.set_exception(result)
                else:
                    w.future.set_result(result)
        for group, _ in executions:
            part = [works[i] for i in group]
            answered = sum(w.rows for i, w in zip(group, part) if not isinstance(results[i], BaseException))
            if answered:
                self.on_batch(part, answered)
        if fault is not None:
            self.on_failure(fault)
        elif refused:
            log.warning("model %s: %d of %d requests in a batch failed on their own values and got 400; the other "
                        "%d were answered", self.name, refused, len(works), len(works) - refused)

    def _failure(self, exc: BaseException, fault: BaseException | None) -> BaseException:
        """The error a request that failed gets: the backend's fault, or its own input's."""
        if fault is not None:
            return BackendFailureError(f"model {self.name} failed while running this request's batch; "
                                       "the server is reloading it, retry shortly")
        reason = engine_reason(exc)
        log.info("model %s failed on one request's values: %s", self.name, reason)
        return RequestFailedError(f"model {self.name} failed on this request's values of inputs "
                                  f"{list(self.input_names)} (other requests succeed, so check them against "
                                  f"the model's metadata): {reason}")

    def _run(self, works: list[Work]) -> tuple[list[Result], list[tuple[list[int], list[float]]],
                                               BaseException | None]:
        """In a worker thread, on a free instance: each request's outputs or the error it
        alone causes; the executions made (the requests of each, and the seconds it spent
        merging, in the runner and splitting); and the backend fault if the runner is
        broken. A ragged batch runs as its padding groups (`padding_groups`), an
        execution each; a group that fails is isolated on its own."""
        pool = self._pool
        runner = pool.get()
        executions: list[tuple[list[int], list[float]]] = []
        try:
            results: list[Result | None] = [None] * len(works)
            for group in padding_groups(works, self.policy.max_padding if self.policy.ragged else None):
                part, clock = [works[i] for i in group], [0.0, 0.0, 0.0]
                executions.append((group, clock))  # the clock is complete once the group ran
                try:
                    answers = self._call(runner, part, clock)
                except Exception as exc:
                    try:
                        to_numpy(runner(self._known_good()))
                    except Exception as fault:  # the runner no longer answers what it answered before
                        # groups already answered keep their answers; the rest get the fault
                        return [exc if r is None else r for r in results], executions, fault
                    answers = self._bisect(runner, part, exc, clock)
                for i, answer in zip(group, answers):
                    results[i] = answer
            return results, executions, None  # type: ignore[return-value]: every group filled its places
        finally:
            pool.put(runner)

    def _bisect(self, runner: Callable, works: list[Work], failure: Exception, clock: list[float]) -> list[Result]:
        """The requests of a failed batch, halved until each part runs or is one request:
        answers for those that run, the error for each that fails alone."""
        if len(works) == 1:
            return [failure]
        results: list[Result] = []
        for part in (works[:len(works) // 2], works[len(works) // 2:]):
            try:
                results += self._call(runner, part, clock)
            except Exception as exc:
                results += self._bisect(runner, part, exc, clock)
        return results

    def _call(self, runner: Callable, works: list[Work], clock: list[float]) -> list[dict[str, np.ndarray]]:
        """Each request's outputs from one execution; the seconds of its three steps are
        added to `clock` (merge, runner, split), as Triton's compute_input/infer/output."""
        start = time.perf_counter()
        merged = merge(works, self.input_names, self.side_inputs)
        ran = time.perf_counter()
        clock[0] += ran - start
        try:
            outputs = to_numpy(runner(merged))
        finally:
            clock[1] += time.perf_counter() - ran
        self._known_good = lambda inputs=works[0].inputs: inputs  # it just ran: a probe that must pass later
        ran = time.perf_counter()
        results = split(outputs, works, self.ragged_dims)
        clock[2] += time.perf_counter() - ran
        return results
