"""The two halves LoadGen drives: a query sample library and a system under test.

LoadGen (mlcommons-loadgen, import name `mlperf_loadgen`) decides *when* queries are
issued and measures when they complete; these classes decide *what* runs. A query
names samples by index into the library; the SUT answers each with
`QuerySamplesComplete`. Performance mode only, so responses carry no data.

    SampleLibrary   N samples from the model's own `spec.sample`, one call per sample so
                    each keeps its own sequence/atom length; batches are padded to the
                    longest row exactly as the server pads them (`zoo.serve.batcher.merge`)
    RunnerSUT       a zoo `Runner` in this process
    HttpSUT         a model on a running `zoo serve` (or Triton), Open Inference Protocol v2

Both SUTs share one queue and worker threads: `issue` only enqueues, so LoadGen's issue
thread never blocks on a model (Server scenario: Poisson arrivals keep coming while a
batch runs); each worker takes what is waiting, up to `take` rows, as one execution
(dynamic batching). SingleStream has one query in flight by definition, so it is
answered inline on the issue thread, as the MLPerf reference harnesses do, with no
thread hand-off in the measured latency.

Threads that call into LoadGen must outlive `StartTest`: LoadGen keeps a per-thread log
buffer, and a thread that exits during a test can crash its logging thread
(mlcommons/inference issues #236 and #440; short-lived completion threads reproduce it
here). So the workers start before the test and are joined after it returns.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import ZooError
from ..serve.batcher import merge
from ..spec import ModelSpec

_STOP = object()
#: a SUT records at most this many distinct error messages (the first is the reason shown).
MAX_ERRORS = 5


@dataclass(frozen=True)
class _Row:
    """One sample in the shape `merge` reads (it pads `inputs` of several requests)."""

    inputs: dict[str, np.ndarray]


class SampleLibrary:
    """`count` distinct single-row samples of `spec`, generated once from `seed`.

    Every sample stays in memory (zoo samples are small), so LoadGen's load and unload
    callbacks have nothing to move; LoadGen only picks indices."""

    def __init__(self, spec: ModelSpec, count: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.names = tuple(t.name for t in spec.inputs)
        self.rows = [_Row({k: np.ascontiguousarray(v) for k, v in spec.sample(1, rng).items()})
                     for _ in range(count)]

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        """The samples at `indices` stacked on the batch axis, zero-padded to the longest."""
        return merge([self.rows[i] for i in indices], self.names)

    def load(self, indices: Sequence[int]) -> None:
        """LoadGen's `LoadSamplesToRam`: every sample already is."""

    def unload(self, indices: Sequence[int]) -> None:
        """LoadGen's `UnloadSamplesFromRam`: nothing to free."""


class QueueSUT:
    """Queue, workers and error bookkeeping; subclasses say how a list of samples runs."""

    def __init__(self, library: SampleLibrary, take: int, concurrency: int, inline: bool) -> None:
        self.library, self.take, self.concurrency, self.inline = library, take, concurrency, inline
        self.errors: list[str] = []
        self.failed = 0  # samples answered after an error rather than run
        #: Server: a query that waited longer than this in the queue means the SUT cannot
        #: keep up; the rest are answered at once (counted as failed) so an overloaded run
        #: ends on LoadGen's schedule instead of draining a backlog for minutes. None: never.
        self.give_up_s: float | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._complete: Callable[[list[int]], None] = lambda ids: None

    def execute(self, indices: list[int]) -> None:
        """Run the samples at `indices` as one execution; raise on failure."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what `execute` holds (connections)."""

    # ------------------------------------------------------------ LoadGen's callbacks

    def issue(self, query_samples: list) -> None:
        """`IssueQuery`: enqueue (or, inline, run) and return."""
        now = time.perf_counter()
        items = [(s.id, s.index, now) for s in query_samples]
        if self.inline:
            self._handle(items)
        else:
            for item in items:
                self._queue.put(item)

    def flush(self) -> None:
        """`FlushQueries`: workers never hold samples back, so nothing is pending here."""

    # ------------------------------------------------------------ lifetime

    def start(self, complete: Callable[[list[int]], None]) -> None:
        """Start the workers; `complete(ids)` tells LoadGen those samples are done."""
        self._complete = complete
        if not self.inline:
            self._workers = [threading.Thread(target=self._work, name=f"zoo-loadgen-{k}", daemon=False)
                             for k in range(self.concurrency)]
            for w in self._workers:
                w.start()

    def stop(self) -> None:
        """Join the workers (after `StartTest` returned: every query is answered by then)."""
        for _ in self._workers:
            self._queue.put(_STOP)
        for w in self._workers:
            w.join()
        self._workers = []

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            items = [item]
            while len(items) < self.take:  # dynamic batching: whatever else is waiting
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._queue.put(_STOP)  # for the next `get` of some worker
                    break
                items.append(nxt)
            self._handle(items)

    def _handle(self, items: list[tuple[int, int, float]]) -> None:
        ids = [i for i, _, _ in items]
        waited = time.perf_counter() - items[0][2]
        if self.give_up_s is not None and waited > self.give_up_s and not self.errors:
            self.errors.append(f"the system fell behind: a query waited {waited:.1f} s for a worker "
                               f"(limit {self.give_up_s:g} s); lower the target QPS")
        if self.errors:  # fail fast: the result is invalid already; finish the test quickly
            self.failed += len(ids)
        else:
            try:
                self.execute([index for _, index, _ in items])
            except Exception as exc:  # reported as the reason the result is invalid
                self.failed += len(ids)
                self._record(exc)
        self._complete(ids)

    def _record(self, exc: Exception) -> None:
        message = str(exc) or type(exc).__name__
        if message not in self.errors and len(self.errors) < MAX_ERRORS:
            self.errors.append(message)

    # ------------------------------------------------------------ calibration

    def measure(self, seconds: float) -> float:
        """Rows per second over `seconds` of back-to-back executions of `take` rows from
        `concurrency` threads (no LoadGen): a warm-up, and the estimate LoadGen needs for
        Offline (`offline_expected_qps`) and the peak-QPS search starts from. A failure is
        recorded like one during the test, which then answers every query at once: the
        run ends promptly, INVALID, with the failure as its reason."""
        n, rows = len(self.library), self.take
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()

        def loop(k: int) -> int:
            done, i = 0, k * 7
            while time.perf_counter() < deadline and not self.errors:
                try:
                    self.execute([(i + j) % n for j in range(rows)])
                except Exception as exc:
                    self._record(exc)
                    break
                done, i = done + rows, i + rows
            return done

        with ThreadPoolExecutor(self.concurrency) as pool:
            total = sum(pool.map(loop, range(self.concurrency)))
        return total / (time.perf_counter() - start)


class RunnerSUT(QueueSUT):
    """A zoo Runner in this process. Several workers call the same runner concurrently
    (onnxruntime sessions and torch modules in inference mode allow it)."""

    def __init__(self, runner: Callable, library: SampleLibrary, take: int, concurrency: int, inline: bool) -> None:
        super().__init__(library, take, concurrency, inline)
        self.runner = runner

    def execute(self, indices: list[int]) -> None:
        self.runner(self.library.batch(indices))


@dataclass(frozen=True)
class Served:
    """A model on a running server, as its metadata describes it."""

    url: str  # scheme://host:port
    name: str  # the server's name for it (aliases resolved)
    spec: ModelSpec  # rebuilt at the served config, so samples match what it was exported for


def served_model(url: str, model: str, timeout: float = 30.0) -> Served:
    """Look `model` up on the server at `url`; a clear `ZooError` when it cannot be used."""
    from urllib.parse import urlsplit

    import httpx

    from ..registry import get_model

    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ZooError(f"the server URL must be http://HOST:PORT, got {url!r}")
    base = f"{parts.scheme}://{parts.netloc}"
    try:
        response = httpx.get(f"{base}/v2/models/{model}", timeout=timeout)
        meta = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ZooError(f"no answer from {base}: {exc}; is `zoo serve` running there?") from None
    if response.status_code != 200 or "name" not in meta:
        raise ZooError(f"server at {base} has no model {model!r}: {meta.get('error', response.status_code)}")
    info = meta.get("zoo") or {}
    if "model" not in info:
        raise ZooError(f"model {meta['name']} on {base} does not say which zoo model it is (not a `zoo serve`?)")
    return Served(base, meta["name"], get_model(info["model"], **info.get("config", {})))


class HttpSUT(QueueSUT):
    """One Open Inference Protocol request per execution, over a keep-alive connection
    pool of `concurrency` connections shared by `concurrency` workers. Single-row
    requests are encoded once up front, so the client adds little to measured latency."""

    def __init__(self, served: Served, library: SampleLibrary, take: int, concurrency: int, inline: bool,
                 timeout: float) -> None:
        import httpx

        from ..serve.protocol import encode_request

        super().__init__(library, take, concurrency, inline)
        self._encode = encode_request
        self.path = f"/v2/models/{served.name}/infer"
        self.http = httpx.Client(base_url=served.url, timeout=timeout, headers={"Accept-Encoding": "identity"},
                                 limits=httpx.Limits(max_connections=concurrency,
                                                     max_keepalive_connections=concurrency))
        self.singles = [encode_request(row.inputs) for row in library.rows]

    def execute(self, indices: list[int]) -> None:
        import httpx

        if len(indices) == 1:
            body, headers = self.singles[indices[0]]
        else:
            body, headers = self._encode(self.library.batch(indices))
        try:
            response = self.http.post(self.path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ZooError(f"request to {self.http.base_url} failed: {exc or type(exc).__name__}") from None
        if response.status_code != 200:
            raise ZooError(f"server answered {response.status_code}: {_error_text(response)}")

    def close(self) -> None:
        self.http.close()


def _error_text(response: Any) -> str:
    try:
        return str(response.json().get("error") or response.text[:300])
    except ValueError:
        return response.text[:300]


class Target:
    """What is measured: a Runner in this process or a model on a server at a URL, with
    its sample library; builds the SUT each scenario needs."""

    def __init__(self, target: Any, spec: ModelSpec | None, model: str | None, samples: int, seed: int,
                 timeout_s: float) -> None:
        self.runner: Callable | None = None
        self.served: Served | None = None
        self.timeout = timeout_s
        if isinstance(target, str):
            if model is None and spec is None:
                raise ZooError("name the served model to benchmark at a server URL")
            self.served = served_model(target, model or spec.name, timeout_s)
            self.spec, self.label, self.model = self.served.spec, self.served.url, self.served.name
            self.default_concurrency = 16  # requests in flight; the server batches them
        elif callable(target):
            if spec is None:
                raise ZooError("give the model spec of the runner to benchmark")
            self.runner, self.spec, self.label, self.model = target, spec, "in-process", spec.name
            self.default_concurrency = 1  # one runner call at a time, using the runner's own threads
        else:
            raise ZooError(f"the target must be a zoo Runner or an http://HOST:PORT URL, got {type(target).__name__}")
        self.library = SampleLibrary(self.spec, samples, seed)

    def sut(self, scenario: str, s: Mapping[str, Any]) -> QueueSUT:
        inline = scenario == "SingleStream"  # one query in flight: answered on LoadGen's thread
        # over HTTP a Server query is one request and the server batches; in process we do
        take = 1 if inline or (self.served and scenario == "Server") else s["batch"]
        concurrency = 1 if inline else s["concurrency"]
        if self.served:
            return HttpSUT(self.served, self.library, take, concurrency, inline, self.timeout)
        return RunnerSUT(self.runner, self.library, take, concurrency, inline)

    def estimate(self, sut: QueueSUT, duration_s: float) -> float:
        """Warm up, and measure samples/s closed-loop in executions shaped like the test's."""
        return sut.measure(min(1.0, max(0.2, duration_s / 10)))
