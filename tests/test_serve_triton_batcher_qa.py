"""NVIDIA Triton's dynamic batcher and model queue QA tests, ported to `zoo serve`.

Source: the GitHub repository triton-inference-server/server, `qa/L0_batcher/batcher_test.py`
(class BatcherTest), `qa/L0_batcher/queue_timeout_test.py` (TestMaxQueueDelayTimeout) and
`qa/L0_model_queue/model_queue_test.py` (class ModelQueueTest), with the model configurations
their `test.sh` files write, and the batch policy of Triton's core
(`src/dynamic_batch_scheduler.cc`, DynamicBatchScheduler::GetDynamicBatch, in the repository
triton-inference-server/core) where a test's expectation follows from it. Triton's tests are
(c) NVIDIA CORPORATION & AFFILIATES under the BSD-3-Clause license; this is our own code.

The model is Triton's add/sub (`onnx_float32_float32_float32`: OUTPUT0 = INPUT0 + INPUT1,
OUTPUT1 = INPUT0 - INPUT1, FP32 [batch, 16]) and its variable-size form (`var_models`: [batch,
-1]), defined below, exported to ONNX and run by `qahold`: ONNX Runtime wrapped by a plugin this
module writes (PLUGIN), whose runner blocks while the file `gate` exists in the server's
directory when a batch holds the value HOLD, and records every execution (model, rows) in the
file `calls` there. Each of Triton's model configurations is one real `zoo serve` subprocess
(SERVERS), its batch policy given on the command line (docs/serving.md, "Dynamic batching":
"the command line wins, then the artifact's `config.pbtxt`"), and every request goes through
Triton's own clients (`tritonclient.http`, `tritonclient.grpc`), every answer checked exactly.

Triton's tests use time windows (a 10 s queue delay, a scheduler that waits until N requests
are queued: TRITONSERVER_DELAY_SCHEDULER, a model that sleeps: execute_delay_ms). Here the
model is held busy instead: a request holding HOLD runs (sent at once: it is a preferred size,
or the delay is 0) and blocks; the test's requests are sent and seen queued
(`zoo_inference_queue_depth`); the gate is removed; the batches that then form are read from
the statistics (`get_inference_statistics`: success and fail counts, inference_count,
execution_count, batch_stats per batch size, queue counts) and from the runner's own record.
The only clock assertions are lower bounds (a request that must wait out the queue delay is
answered no sooner) and bounds many times what they measure.

Differences asserted as docs/serving.md documents them:
- a request that times out is answered 503 / UNAVAILABLE, as Triton's batcher answers it,
  "request timeout expired: model M did not answer within T s" (Triton: "Request timeout
  expired"), and the timeout covers the request's whole stay, not only the queue (docs/serving.md,
  "Parameters" and the status table). `--request-timeout` is
  Triton's default_timeout_microseconds, always overridable downwards (allow_timeout_override).
- a full queue is 503 / UNAVAILABLE, as Triton's; the words are zoo's ("M has 8 requests
  queued, its limit", Triton: "Exceeds maximum queue size"), with `Retry-After: 1` ("Dynamic
  batching": "`--max-queue-size N` | 256 | waiting requests per model; one more is answered 503
  at once, with `Retry-After: 1`").
- requests refused from a full queue or timed out count in `fail` (Differences from Triton:
  "a request refused before it runs (bad shape, bad JSON, timed out in the queue) | not counted
  in `fail` | counted in `fail` and `zoo_inference_failures_total`").
- requests of different sizes are batched together (zero-padded) by default, which Triton does
  only for inputs with `allow_ragged_batch` ("Ragged batching": "Requests whose non-batch
  dynamic axes differ (sequence lengths, atom counts) are batched together"); `--no-ragged`
  ("batch only requests whose shapes are identical") is Triton's default, so the servers of
  Triton's var_models run with it and the allow_ragged case runs on a server without it.

Defects the port found, fixed in zoo/serve/batcher.py (each test failed before):
- Preferred batch sizes: zoo sent a batch as soon as it held at least the smallest preferred
  size, and took every queued request up to max_batch_size; Triton sends a batch at once only
  when it is exactly a preferred size (the largest it can form without passing the largest
  preferred size), or cannot grow, and otherwise waits out max_queue_delay; it never grows a
  batch past the largest preferred size (GetDynamicBatch). zoo now forms batches by that rule
  (Batcher._select): test_static_batch_not_preferred, test_multi_batch_not_preferred,
  test_multi_batch_sum_gt_max_preferred, test_multi_batch_delayed_sum_gt_max_preferred,
  test_multi_batch_use_best_preferred, test_preferred_batch_only_unaligned,
  test_preferred_batch_only_use_biggest_preferred.
- A queued request that timed out did not let the batch it held back go: the batcher slept
  until the queue delay or the next arrival (Triton forms the batch again at the timeout).
  test_timeout_override_pending_requests.
- Shapes (`--no-ragged`): a pending batch was not sent when a request of another shape arrived
  behind it; it waited out the queue delay, and a later request of its shape could pass the
  other (Triton sends it at once: the batch cannot grow; answers keep the queue's order).
  test_multi_batch_different_shape_sends_pending.
- Statistics: a ragged batch that runs as several executions (padding groups, "run as a few
  executions of similar sizes") was counted as one execution of its total rows.
  test_ragged_executions_counted_as_run.

Not ported, and why:
- test_multi_batch_preserve_ordering and verify_timestamps.py: `preserve_ordering` is no zoo
  setting, and the check reads Triton's trace file (trace is not offered).
- test_policy_delay, test_priority_levels, test_max_priority_levels, test_priority_with_policy:
  the queue policy's `timeout_action: DELAY` and priority levels are not offered (docs "Not
  supported": priorities; a `priority` parameter is a 400, tests/test_serve_triton_http.py).
- the ensemble trials of model_queue_test.py: ensembles are Triton-only.
- the shared-memory variants (TEST_SYSTEM_SHARED_MEMORY, TEST_CUDA_SHARED_MEMORY): system shared
  memory is tests/test_serve_triton_shm_qa.py; CUDA shared memory is not offered.
- the loop over backends (onnx, libtorch, plan, python): one engine here, ONNX Runtime.
- instance_queue_test (a C++ unit test of Triton core) and the valgrind runs.
"""

from __future__ import annotations

import collections
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import zoo
from zoo import AxisRange, ModelSpec, TensorSpec, registry

pytest.register_assert_rewrite("serve_support")
from serve_support import ServerProcess  # noqa: E402

SIZE = 16
FIXED = "batcherqa.addsub.qahold.fp32"  # Triton's onnx_float32_float32_float32 ([batch, 16])
VAR = "batcherqa.addsubvar.qahold.fp32"  # its var_models form ([batch, -1])
SPEC_NAMES = {FIXED: "batcherqa.addsub", VAR: "batcherqa.addsubvar"}
HOLD = 4321.5  # a batch holding this value blocks while the server's `gate` file exists
LONG_DELAY_MS = 10000  # Triton's _max_queue_delay_ms
DELAY = 1.5  # seconds: the queue delay of the servers whose tests wait it out
POLICY_TIMEOUT = 1.0  # seconds: --request-timeout, Triton's default_timeout_microseconds

PLUGIN = f'''"""Test-only backend written by tests/test_serve_triton_batcher_qa.py: ONNX Runtime whose
runner blocks while the file `gate` exists in the server's working directory when a batch
holds {HOLD} (writing `held` there meanwhile), and appends each execution, "MODEL ROWS", to
the file `calls` there: only in a server's directory (marked by a file `server`), not where an
export runs it."""
import time
from pathlib import Path

import numpy as np
from zoo_onnxruntime import OnnxRuntimeBackend

import zoo


class HoldRunner:
    def __init__(self, inner, model):
        self.inner, self.model = inner, model
        self.input_names, self.output_names = inner.input_names, inner.output_names

    def __call__(self, inputs):
        here = Path.cwd()
        if not (here / "server").exists():  # an export's checks, in the test process
            return self.inner(inputs)
        if (np.asarray(inputs["INPUT0"]) == {HOLD}).any():
            (here / "held").write_text("")
            deadline = time.monotonic() + 60
            while (here / "gate").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            (here / "held").unlink()
        with open(here / "calls", "a") as calls:
            calls.write(f"{{self.model}} {{len(inputs['INPUT0'])}}\\n")
        return self.inner(inputs)


class HoldBackend(OnnxRuntimeBackend):
    name = "qahold"
    description = "ONNX Runtime held busy on request (batcher QA tests only)"
    precisions = {{"cpu": ("fp32",)}}

    def load(self, path, spec, precision, device, threads=None, info=None):
        return HoldRunner(super().load(path, spec, precision, device, threads, info), spec.name)


@zoo.hookimpl
def zoo_register_backends(register):
    register(HoldBackend())
'''

#: Triton's model configurations (test.sh), as `zoo serve` options; the axis maximum is 32
#: (Triton's 100 for custom_zero_1_float32: 32 is as good for 12 requests)
SERVERS = {
    # models / var_models: max_batch_size 8, preferred [2, 6], max_queue_delay 10 s
    "dynamic": ("--max-batch-size", "8", "--preferred-batch-sizes", "2,6", "--max-queue-delay-ms",
                str(LONG_DELAY_MS), "--no-ragged"),
    # the same with a delay the tests wait out
    "short": ("--max-batch-size", "8", "--preferred-batch-sizes", "2,6", "--max-queue-delay-ms",
              str(DELAY * 1000), "--no-ragged"),
    # var_models/custom_zero_1_float32 with allow_ragged_batch: one execution however padded
    "ragged": ("--max-batch-size", "8", "--preferred-batch-sizes", "2,6", "--max-queue-delay-ms",
               str(LONG_DELAY_MS), "--max-padding", "none"),
    # preferred_batch_only_models: preferred [4, 6], no max_queue_delay (0)
    "preferred": ("--max-batch-size", "8", "--preferred-batch-sizes", "4,6", "--max-queue-delay-ms", "0"),
    # custom_models, test_max_queue_delay_only_default: no preferred size, delay 0
    "delay0": ("--max-batch-size", "32", "--preferred-batch-sizes", "32", "--max-queue-delay-ms", "0"),
    # custom_models, test_max_queue_delay_only_non_default (Triton: 20 ms)
    "delay": ("--max-batch-size", "32", "--preferred-batch-sizes", "32", "--max-queue-delay-ms",
              str(DELAY * 1000)),
    # model_queue test_max_queue_size: max_batch_size 32, preferred [4, 8], max_queue_size 8
    "queue": ("--max-batch-size", "32", "--preferred-batch-sizes", "4,8", "--max-queue-delay-ms", "0",
              "--max-queue-size", "8"),
    # model_queue test_policy_reject / test_timeout_override: delay 10 s, a default timeout
    "policy": ("--max-batch-size", "32", "--preferred-batch-sizes", "4,8", "--max-queue-delay-ms",
               str(LONG_DELAY_MS), "--request-timeout", str(POLICY_TIMEOUT)),
}


class AddSub(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> dict[str, torch.Tensor]:  # noqa: N803
        return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def addsub_spec(name: str, variable: bool) -> ModelSpec:
    shape = ("batch", "size" if variable else SIZE)
    # the variable size's sample is shorter than its maximum, so that zoo can try padding it
    axes = {"batch": AxisRange(1, 32, 32), **({"size": AxisRange(1, 8, SIZE)} if variable else {})}

    def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        size = 8 if variable else SIZE
        return {n: rng.integers(-50, 50, (batch, size)).astype(np.float32) for n in ("INPUT0", "INPUT1")}

    return ModelSpec(name=name, domain="test", task="add-sub",
                     inputs=(TensorSpec("INPUT0", "float32", shape), TensorSpec("INPUT1", "float32", shape)),
                     outputs=(TensorSpec("OUTPUT0", "float32", shape), TensorSpec("OUTPUT1", "float32", shape)),
                     build=AddSub, sample=sample, axes=axes)


class BatcherServer(ServerProcess):
    """`python -m zoo --plugin tests/serve_plugin.py --plugin PLUGIN serve REPO ARGS`, in a
    directory of its own: the runner's `gate`, `held` and `calls` files are there."""

    def __init__(self, repository: Path, plugin: Path, directory: Path, *args: str) -> None:
        directory.mkdir(parents=True)
        (directory / "server").write_text("")  # the runner records and holds only here
        self.dir = directory
        super().__init__(repository, *args, log=directory / "server.log", plugins=[plugin])


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, BatcherServer]]:
    root = tmp_path_factory.mktemp("batcher_qa")
    plugin = root / "batcher_qa_plugin.py"
    plugin.write_text(PLUGIN)
    repo = root / "exports"
    registry.load_plugin_file(plugin)
    try:
        for name, variable in (("batcherqa.addsub", False), ("batcherqa.addsubvar", True)):
            zoo.export(addsub_spec(name, variable), "qahold", repository=repo, random_init=True)
    finally:
        registry.unload_plugin_file(plugin)
    started: dict[str, BatcherServer] = {}
    try:
        for key, args in SERVERS.items():  # all start at once, then each is waited for
            started[key] = BatcherServer(repo, plugin, root / key, *args)
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.kill()


@pytest.fixture
def server(request, servers) -> Iterator[BatcherServer]:
    """The server of the key a test is parametrized with (`on(KEY)`), checked live at the end
    of the test (as Triton's tests end), with no gate left behind."""
    proc = servers[request.param]
    yield proc
    (proc.dir / "gate").unlink(missing_ok=True)
    assert httpx.get(f"{proc.url}/v2/health/live", timeout=10).status_code == 200


def on(key: str):
    """The test runs on the server of Triton's configuration `key` (SERVERS)."""
    return pytest.mark.parametrize("server", [key], indirect=True)


# ---------------------------------------------------------------- requests


def client_for(server: BatcherServer, protocol: str):
    if protocol == "http":
        return triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=120,
                                                 connection_timeout=120)
    return triton_grpc.InferenceServerClient(server.grpc_url)


def draw(seed: int, rows: int, size: int = SIZE, hold: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """INPUT0 and INPUT1 as infer_util.py draws FP32 ones: integers in half int16's range, so
    every sum and difference is exact."""
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-8192, 8192, (rows, size)).astype(np.float32) for _ in range(2))
    if hold:
        a.flat[0] = HOLD
    return a, b


def infer(server: BatcherServer, model: str, rows: int, *, protocol: str = "http", size: int = SIZE, seed: int = 0,
          outputs: tuple[str, ...] = ("OUTPUT0", "OUTPUT1"), timeout_us: int | None = None,
          hold: bool = False) -> float:
    """infer_util.py's infer_exact: one request of `rows` x `size`, asking for `outputs` in that
    order; each output exact, no other output returned. The seconds it took."""
    module = triton_http if protocol == "http" else triton_grpc
    a, b = draw(seed, rows, size, hold)
    tensors = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    start = time.monotonic()
    with client_for(server, protocol) as client:
        result = client.infer(model, tensors, outputs=[module.InferRequestedOutput(n) for n in outputs],
                              timeout=timeout_us)
    elapsed = time.monotonic() - start
    want = {"OUTPUT0": a + b, "OUTPUT1": a - b}
    for name in ("OUTPUT0", "OUTPUT1"):
        got = result.as_numpy(name)
        if name in outputs:
            np.testing.assert_array_equal(got, want[name], err_msg=f"{model} {name}")
        else:
            assert got is None, f"{name} was not requested"
    return elapsed


def status(ex: BaseException) -> str:
    """The HTTP status or gRPC code of a failed call, as tritonclient reports it."""
    assert isinstance(ex, InferenceServerException), repr(ex)
    return str(ex.status())


def queue_depth(server: BatcherServer, model: str) -> int:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    match = re.search(rf'zoo_inference_queue_depth{{model="{re.escape(model)}",version="1"}} ([0-9.]+)', text)
    return int(float(match[1])) if match else 0


def failures(server: BatcherServer, model: str, reason: str) -> int:
    """zoo_inference_failures_total of `model` for `reason`."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return int(sum(float(m[2]) for m in re.finditer(r"zoo_inference_failures_total\{([^}]*)\} ([0-9.e+]+)", text)
                   if f'model="{model}"' in m[1] and f'reason="{reason}"' in m[1]))


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def wait_queued(server: BatcherServer, model: str, n: int, answered: list[Future] = ()) -> None:
    """Until `n` requests wait in the model's queue (or, for `answered`, those have an answer)."""
    wait_for(lambda: queue_depth(server, model) + sum(f.done() for f in answered) >= n, f"{n} queued on {model}")


class Held:
    """The model kept busy: a request holding HOLD runs and blocks until `release`."""

    def __init__(self, server: BatcherServer, pool: ThreadPoolExecutor, model: str, rows: int,
                 size: int = SIZE, protocol: str = "grpc") -> None:
        self.server, self.gate, self.held = server, server.dir / "gate", server.dir / "held"
        self.gate.write_text("")
        self.future = pool.submit(infer, server, model, rows, size=size, protocol=protocol, seed=999, hold=True)
        wait_for(self.held.exists, "the held request to run")

    def release(self) -> Future:
        self.gate.unlink(missing_ok=True)
        return self.future


# ---------------------------------------------------------------- statistics


def snapshot(server: BatcherServer, model: str) -> SimpleNamespace:
    """The model's statistics as Triton's check_status reads them (gRPC), and the runner's record."""
    with triton_grpc.InferenceServerClient(server.grpc_url) as client:
        (stats,) = client.get_inference_statistics(model, "1").model_stats
    calls_file = server.dir / "calls"
    lines = calls_file.read_text().split() if calls_file.exists() else []
    calls = [int(rows) for name, rows in zip(lines[::2], lines[1::2]) if name == SPEC_NAMES[model]]
    return SimpleNamespace(success=stats.inference_stats.success.count, fail=stats.inference_stats.fail.count,
                           queue=stats.inference_stats.queue.count, queue_ns=stats.inference_stats.queue.ns,
                           compute_infer=stats.inference_stats.compute_infer.count,
                           inference=stats.inference_count, execution=stats.execution_count,
                           batches={b.batch_size: b.compute_infer.count for b in stats.batch_stats},
                           name=stats.name, version=stats.version, calls=calls)


def check_status(server: BatcherServer, model: str, before: SimpleNamespace, batch_exec: dict[int, int] | None,
                 request_cnt: int, infer_cnt: int, exec_count: tuple[int, ...], fail_cnt: int = 0) -> SimpleNamespace:
    """batcher_test.py's check_status, on what this test added to the statistics: executions
    per batch size (`batch_exec`), successful requests, inferences (rows) and executions; and
    failed requests. Also: a queue and compute_infer entry per successful request, and the
    runner's own record of executions equal to the batch statistics."""
    after = snapshot(server, model)
    assert (after.name, after.version) == (model, "1")
    batches = {size: after.batches.get(size, 0) - before.batches.get(size, 0) for size in after.batches}
    batches = {size: count for size, count in batches.items() if count}
    ran = dict(collections.Counter(after.calls[len(before.calls):]))
    if batch_exec is not None:
        assert batches == batch_exec, f"executions per batch size: {batches}, expected {batch_exec}"
    assert after.success - before.success == request_cnt, "successful requests"
    assert after.execution - before.execution in exec_count, "execution_count"
    assert after.inference - before.inference == infer_cnt, "inference_count"
    assert after.fail - before.fail == fail_cnt, "failed requests"
    assert after.queue - before.queue == request_cnt and after.compute_infer - before.compute_infer == request_cnt
    assert ran == batches, f"the runner executed {ran}; the statistics say {batches}"
    assert sum(ran.values()) == after.execution - before.execution, "execution_count is not what ran"
    return after


def ok(future: Future, timeout: float = 60) -> float:
    return future.result(timeout)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("key, preferred, delay_us", [
    ("dynamic", [2, 6], LONG_DELAY_MS * 1000), ("short", [2, 6], int(DELAY * 1e6)), ("preferred", [4, 6], 0),
    ("queue", [4, 8], 0), ("policy", [4, 8], LONG_DELAY_MS * 1000)])
def test_check_setup(servers, key, preferred, delay_us):
    # Triton: check_setup, at the start of each test: the model's configuration says the
    # batcher settings test.sh wrote (here: the command line's), over gRPC and HTTP.
    server = servers[key]
    for model in (FIXED, VAR):
        with triton_grpc.InferenceServerClient(server.grpc_url) as client:
            config = client.get_model_config(model).config
        assert sorted(config.dynamic_batching.preferred_batch_size) == preferred
        assert config.dynamic_batching.max_queue_delay_microseconds == delay_us
        with client_for(server, "http") as client:
            batching = client.get_model_config(model)["dynamic_batching"]
        assert sorted(batching["preferred_batch_size"]) == preferred
        assert batching["max_queue_delay_microseconds"] == delay_us


# ---------------------------------------------------------------- batcher_test.py: models (delay 10 s)


@on("dynamic")
def test_static_batch_preferred(server):
    # Triton: test_static_batch_preferred: requests of a preferred size (2, then 6) are
    # executed at once, each alone.
    before = snapshot(server, FIXED)
    assert infer(server, FIXED, 2) < LONG_DELAY_MS / 2000
    assert infer(server, FIXED, 6, protocol="grpc") < LONG_DELAY_MS / 2000
    check_status(server, FIXED, before, {2: 1, 6: 1}, 2, 8, (2,))


@on("dynamic")
def test_static_batch_gt_max_preferred(server):
    # Triton: test_static_batch_gt_max_preferred: a request larger than the largest preferred
    # size (7 > 6) is executed at once, even though the queue delay is long.
    before = snapshot(server, FIXED)
    assert infer(server, FIXED, 7, protocol="grpc") < LONG_DELAY_MS / 2000
    check_status(server, FIXED, before, {7: 1}, 1, 7, (1,))


@on("dynamic")
def test_multi_batch_gt_max_preferred(server):
    # Triton: test_multi_batch_gt_max_preferred: 3 rows (not preferred), then 7 (larger than
    # the largest preferred size, and 3 + 7 > max_batch_size): two executions, both answered
    # without waiting out the delay.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(infer, server, FIXED, 3)
        wait_queued(server, FIXED, 1, [first])
        second = pool.submit(infer, server, FIXED, 7, seed=1)
        assert ok(first) < LONG_DELAY_MS / 2000 and ok(second) < LONG_DELAY_MS / 2000
    check_status(server, FIXED, before, {3: 1, 7: 1}, 2, 10, (2,))


@on("dynamic")
@pytest.mark.parametrize("outputs", [(("OUTPUT0",), ("OUTPUT0",)), (("OUTPUT1",), ("OUTPUT1",)),
                                     (("OUTPUT0",), ("OUTPUT1",)), (("OUTPUT0", "OUTPUT1"), ("OUTPUT1", "OUTPUT0"))],
                         ids=["same_output0", "same_output1", "different_outputs", "different_output_order"])
def test_multi_outputs(server, outputs):
    # Triton: test_multi_same_output0, test_multi_same_output1, test_multi_different_outputs,
    # test_multi_different_output_order: two 1-row requests asking for other outputs, or the
    # same in another order, are batched together (2, a preferred size) and each gets exactly
    # what it asked for.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(infer, server, FIXED, 1, outputs=outputs[0], protocol="grpc")
        wait_queued(server, FIXED, 1)
        second = pool.submit(infer, server, FIXED, 1, outputs=outputs[1], seed=1)
        ok(first), ok(second)
    check_status(server, FIXED, before, {2: 1}, 2, 2, (1,))


@on("dynamic")
def test_multi_batch_use_biggest_preferred(server):
    # Triton: test_multi_batch_use_biggest_preferred (TRITONSERVER_DELAY_SCHEDULER=6): six
    # 1-row requests queued together form one batch of the largest preferred size, 6.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(8) as pool:
        held = Held(server, pool, FIXED, 2)
        futures = [pool.submit(infer, server, FIXED, 1, seed=k) for k in range(6)]
        wait_queued(server, FIXED, 6)
        ok(held.release())
        for future in futures:
            assert ok(future) < LONG_DELAY_MS / 2000
    check_status(server, FIXED, before, {2: 1, 6: 1}, 7, 8, (2,))


@on("dynamic")
def test_multi_batch_preferred_different_shape(server):
    # Triton: test_multi_batch_preferred_different_shape (var_models): 1 + 3 rows of size 16,
    # then 1 + 5 rows of size 8: the sizes are not merged, and each pair forms a preferred size
    # (4 is sent when a request of another size arrives; 6 at once), so no one waits the delay.
    before = snapshot(server, VAR)
    with ThreadPoolExecutor(4) as pool:
        first = [pool.submit(infer, server, VAR, 1)]
        wait_queued(server, VAR, 1, first)
        first.append(pool.submit(infer, server, VAR, 3, seed=1))
        wait_queued(server, VAR, 2, first)
        second = [pool.submit(infer, server, VAR, 1, size=8, seed=2)]
        wait_queued(server, VAR, 1, second)
        second.append(pool.submit(infer, server, VAR, 5, size=8, seed=3))
        for future in first + second:
            assert ok(future) < LONG_DELAY_MS / 2000
    check_status(server, VAR, before, {4: 1, 6: 1}, 4, 10, (2,))


@on("dynamic")
def test_multi_batch_delayed_preferred_different_shape(server):
    # Triton: test_multi_batch_delayed_preferred_different_shape (TRITONSERVER_DELAY_SCHEDULER=4):
    # the same four requests queued together: a batch of 4 (size 16), then one of 6 (size 8),
    # both at once.
    before = snapshot(server, VAR)
    with ThreadPoolExecutor(6) as pool:
        held = Held(server, pool, VAR, 2)
        futures = []
        for k, (rows, size) in enumerate([(1, 16), (3, 16), (1, 8), (5, 8)]):
            futures.append(pool.submit(infer, server, VAR, rows, size=size, seed=k))
            wait_queued(server, VAR, k + 1)
        ok(held.release())
        for future in futures:
            assert ok(future) < LONG_DELAY_MS / 2000
    check_status(server, VAR, before, {2: 1, 4: 1, 6: 1}, 5, 12, (3,))


@on("dynamic")
def test_multi_batch_different_shape_sends_pending(server):
    # Triton: test_multi_batch_different_shape, its first request: 1 row of size 16 waits (not a
    # preferred size); when 1 row of size 8 arrives, the pending batch cannot grow (another
    # shape), so Triton executes it at once (its answer within 2 x 3 s, the delay being 10 s;
    # GetDynamicBatch: "it has a different shape then this request, so send the pending batch").
    # Bounded here by each request's own timeout (1.5 s, far above an immediate answer), so
    # nothing is left waiting: the second request times out in both servers.
    before = snapshot(server, VAR)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(infer, server, VAR, 1, timeout_us=1_500_000)
        wait_queued(server, VAR, 1)
        second = pool.submit(infer, server, VAR, 1, size=8, seed=1, timeout_us=1_500_000)
        with pytest.raises(InferenceServerException):
            second.result(60)
        ok(first)
    check_status(server, VAR, before, {1: 1}, 1, 1, (1,), fail_cnt=1)


# ---------------------------------------------------------------- batcher_test.py: delays waited out


@on("short")
def test_static_batch_lt_any_preferred(server):
    # Triton: test_static_batch_lt_any_preferred: 1 row, smaller than any preferred size, waits
    # out the max queue delay, then runs alone.
    before = snapshot(server, FIXED)
    assert infer(server, FIXED, 1) >= DELAY
    check_status(server, FIXED, before, {1: 1}, 1, 1, (1,))


@on("short")
def test_static_batch_not_preferred(server):
    # Triton: test_static_batch_not_preferred: 3 rows, between the preferred sizes 2 and 6, wait
    # out the max queue delay (not a preferred size, and the batch can still grow).
    before = snapshot(server, FIXED)
    assert infer(server, FIXED, 3) >= DELAY
    check_status(server, FIXED, before, {3: 1}, 1, 3, (1,))


@on("short")
def test_multi_batch_not_preferred(server):
    # Triton: test_multi_batch_not_preferred: 1 row, then 3: together 4, not a preferred size,
    # so both wait out the delay (counted from the first), then run as one batch of 4.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(2) as pool:
        start = time.monotonic()
        first = pool.submit(infer, server, FIXED, 1)
        wait_queued(server, FIXED, 1)
        second = pool.submit(infer, server, FIXED, 3, seed=1)
        ok(first), ok(second)
        assert time.monotonic() - start >= DELAY
    check_status(server, FIXED, before, {4: 1}, 2, 4, (1,))


@on("short")
def test_multi_batch_sum_gt_max_preferred(server):
    # Triton: test_multi_batch_sum_gt_max_preferred: 3 rows, then 4 (3 + 4 > 6, the largest
    # preferred size): the 3 run at once, alone; the 4, not a preferred size, wait out the delay.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(infer, server, FIXED, 3)
        wait_queued(server, FIXED, 1, [first])
        second = pool.submit(infer, server, FIXED, 4, seed=1)
        ok(first)
        assert ok(second) >= DELAY
    check_status(server, FIXED, before, {3: 1, 4: 1}, 2, 7, (2,))


@on("short")
def test_multi_batch_different_shape(server):
    # Triton: test_multi_batch_different_shape (var_models, not ragged): 1 row of size 16, then 1
    # of size 8: never merged, two executions of 1; the second waits out the delay.
    before = snapshot(server, VAR)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(infer, server, VAR, 1)
        wait_queued(server, VAR, 1)
        second = pool.submit(infer, server, VAR, 1, size=8, seed=1)
        ok(first)
        assert ok(second) >= DELAY
    check_status(server, VAR, before, {1: 2}, 2, 2, (2,))


@on("short")
def test_multi_batch_not_preferred_different_shape(server):
    # Triton: test_multi_batch_not_preferred_different_shape: 1 + 3 rows of size 16 and 1 of
    # size 8: the 16s run together (4), the 8 alone after the delay.
    before = snapshot(server, VAR)
    with ThreadPoolExecutor(4) as pool:
        held = Held(server, pool, VAR, 2)
        futures = []
        for k, (rows, size) in enumerate([(1, 16), (3, 16), (1, 8)]):
            futures.append(pool.submit(infer, server, VAR, rows, size=size, seed=k))
            wait_queued(server, VAR, k + 1)
        ok(held.release())
        ok(futures[0]), ok(futures[1])
        assert ok(futures[2]) >= DELAY
    check_status(server, VAR, before, {2: 1, 4: 1, 1: 1}, 4, 7, (3,))


@on("short")
def test_multi_batch_delayed_sum_gt_max_preferred(server):
    # Triton: test_multi_batch_delayed_sum_gt_max_preferred (TRITONSERVER_DELAY_SCHEDULER=2):
    # 3 and 4 rows queued together: 3 + 4 passes the largest preferred size (6), so the 3 run
    # at once, alone, and the 4 wait out the delay.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(3) as pool:
        held = Held(server, pool, FIXED, 2)
        first = pool.submit(infer, server, FIXED, 3)
        wait_queued(server, FIXED, 1)
        second = pool.submit(infer, server, FIXED, 4, seed=1)
        wait_queued(server, FIXED, 2)
        ok(held.release())
        ok(first), ok(second)
    check_status(server, FIXED, before, {2: 1, 3: 1, 4: 1}, 3, 9, (3,))


@on("short")
def test_multi_batch_delayed_use_max_batch(server):
    # Triton: test_multi_batch_delayed_use_max_batch (TRITONSERVER_DELAY_SCHEDULER=3): 3 and 4
    # rows queued; once they have waited past the delay, 1 more: all three run as one batch of
    # max_batch_size, 8.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(4) as pool:
        held = Held(server, pool, FIXED, 2)
        futures = [pool.submit(infer, server, FIXED, 3)]
        wait_queued(server, FIXED, 1)
        futures.append(pool.submit(infer, server, FIXED, 4, seed=1))
        wait_queued(server, FIXED, 2)
        time.sleep(DELAY + 0.2)
        futures.append(pool.submit(infer, server, FIXED, 1, seed=2))
        wait_queued(server, FIXED, 3)
        ok(held.release())
        assert ok(futures[0]) >= DELAY and ok(futures[1]) >= DELAY
        ok(futures[2])
    check_status(server, FIXED, before, {2: 1, 8: 1}, 4, 10, (2,))


@on("short")
def test_multi_batch_use_best_preferred(server):
    # Triton: test_multi_batch_use_best_preferred (TRITONSERVER_DELAY_SCHEDULER=3): three 1-row
    # requests queued: two run at once as a batch of the preferred size 2; the third waits out
    # the delay and runs alone.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(4) as pool:
        held = Held(server, pool, FIXED, 2)
        futures = []
        for k in range(3):
            futures.append(pool.submit(infer, server, FIXED, 1, seed=k))
            wait_queued(server, FIXED, k + 1)
        ok(held.release())
        for future in futures:
            ok(future)
    check_status(server, FIXED, before, {2: 2, 1: 1}, 4, 5, (3,))


# ---------------------------------------------------------------- ragged batching


@on("ragged")
def test_multi_batch_different_shape_allow_ragged(server):
    # Triton: test_multi_batch_different_shape_allow_ragged (custom_zero_1_float32 with
    # allow_ragged_batch): 1 row of size 16 and 1 of size 8 form one batch of 2 (a preferred
    # size). zoo batches different sizes by default (docs "Ragged batching"), each answer cut
    # back to its own size and exact.
    before = snapshot(server, VAR)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(infer, server, VAR, 1)
        wait_queued(server, VAR, 1)
        second = pool.submit(infer, server, VAR, 1, size=8, seed=1)
        assert ok(first) < LONG_DELAY_MS / 2000 and ok(second) < LONG_DELAY_MS / 2000
    check_status(server, VAR, before, {2: 1}, 2, 2, (1,))


@on("queue")
def test_ragged_executions_counted_as_run(server):
    # execution_count and batch_stats count the model's executions (Triton: "the number of
    # successful inference executions performed for the model"). With zoo's default
    # --max-padding, 1 row of size 16 and 1 of size 2 batched together run as two executions
    # (docs: "run as a few executions of similar sizes"): the statistics must say two of 1.
    before = snapshot(server, VAR)
    with ThreadPoolExecutor(3) as pool:
        held = Held(server, pool, VAR, 8)
        futures = [pool.submit(infer, server, VAR, 1)]
        wait_queued(server, VAR, 1)
        futures.append(pool.submit(infer, server, VAR, 1, size=2, seed=1))
        wait_queued(server, VAR, 2)
        ok(held.release())
        ok(futures[0]), ok(futures[1])
    check_status(server, VAR, before, {8: 1, 1: 2}, 3, 10, (3,))


# ---------------------------------------------------------------- preferred_batch_only_models


def queue_ones(server: BatcherServer, n: int, hold_rows: int) -> SimpleNamespace:
    """n 1-row requests queued together behind a held one (TRITONSERVER_DELAY_SCHEDULER=n)."""
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(n + 1) as pool:
        held = Held(server, pool, FIXED, hold_rows)
        futures = [pool.submit(infer, server, FIXED, 1, seed=k, protocol="grpc" if k % 2 else "http")
                   for k in range(n)]
        wait_queued(server, FIXED, n)
        ok(held.release())
        for future in futures:
            assert ok(future) < LONG_DELAY_MS / 2000
    return before


@on("preferred")
def test_preferred_batch_only_aligned(server):
    # Triton: test_preferred_batch_only_aligned (preferred [4, 6], no delay): 4 queued 1-row
    # requests form one batch of the preferred size 4.
    before = queue_ones(server, 4, 1)
    check_status(server, FIXED, before, {1: 1, 4: 1}, 5, 5, (2,))


@on("preferred")
def test_preferred_batch_only_unaligned(server):
    # Triton: test_preferred_batch_only_unaligned: 5 queued 1-row requests: a batch of the
    # preferred size 4, then 1.
    before = queue_ones(server, 5, 1)
    check_status(server, FIXED, before, {1: 2, 4: 1}, 6, 6, (3,))


@on("preferred")
def test_preferred_batch_only_use_biggest_preferred(server):
    # Triton: test_preferred_batch_only_use_biggest_preferred: 7 queued 1-row requests: a batch
    # of the largest preferred size, 6, then 1.
    before = queue_ones(server, 7, 1)
    check_status(server, FIXED, before, {1: 2, 6: 1}, 8, 8, (3,))


@on("preferred")
def test_preferred_batch_only_use_no_preferred_size(server):
    # Triton: test_preferred_batch_only_use_no_preferred_size: 3 queued 1-row requests, no
    # preferred size reachable and no delay: one batch of 3.
    before = queue_ones(server, 3, 1)
    check_status(server, FIXED, before, {1: 1, 3: 1}, 4, 4, (2,))


# ---------------------------------------------------------------- custom_models: max queue delay only


@on("delay0")
def test_max_queue_delay_only_default(server):
    # Triton: test_max_queue_delay_only_default (max_queue_delay 0, no preferred size, a model
    # that takes 100 ms): of 12 1-row requests the first runs alone, at once; the 11 others,
    # queued meanwhile, run as a second batch. Two executions.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(12) as pool:
        held = Held(server, pool, FIXED, 1)  # the first request
        futures = [pool.submit(infer, server, FIXED, 1, seed=k) for k in range(11)]
        wait_queued(server, FIXED, 11)
        ok(held.release())
        for future in futures:
            ok(future)
    check_status(server, FIXED, before, {1: 1, 11: 1}, 12, 12, (2,))


@on("delay")
def test_max_queue_delay_only_non_default(server):
    # Triton: test_max_queue_delay_only_non_default (a 20 ms delay; here 1.5 s): 12 1-row
    # requests sent at once run as one batch, or two where some arrive after the delay.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(infer, server, FIXED, 1, seed=k, protocol="grpc" if k % 2 else "http")
                   for k in range(12)]
        for future in futures:
            ok(future)
    check_status(server, FIXED, before, None, 12, 12, (1, 2))


# ---------------------------------------------------------------- model_queue_test.py


@on("queue")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_max_queue_size(server, protocol):
    # Triton: test_max_queue_size (max_queue_size 8; the model busy with a preceding request of
    # the preferred size 8): of 10 1-row requests, 8 wait and are answered, 2 are refused at once
    # with UNAVAILABLE "Exceeds maximum queue size" (zoo: 503 / UNAVAILABLE, its own words, and
    # Retry-After: 1). Queue statistics: the 8 waited at least as long as the model was held;
    # the 2 refused count in `fail` and in zoo_inference_failures_total{reason="queue_full"}.
    before, refused_before = snapshot(server, FIXED), failures(server, FIXED, "queue_full")
    with ThreadPoolExecutor(12) as pool:
        held = Held(server, pool, FIXED, 8, protocol=protocol)
        futures = [pool.submit(infer, server, FIXED, 1, seed=k, protocol=protocol) for k in range(10)]
        wait_for(lambda: queue_depth(server, FIXED) == 8 and sum(f.done() for f in futures) == 2,
                 "8 queued and 2 refused")
        refused = [f for f in futures if f.done()]
        for ex in (f.exception() for f in refused):
            assert status(ex) in ("503", "StatusCode.UNAVAILABLE"), ex
            assert f"{FIXED} has 8 requests queued, its limit" in ex.message(), ex.message()
        a, b = draw(0, 1)
        body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, SIZE], "data": x.ravel().tolist()}
                           for n, x in (("INPUT0", a), ("INPUT1", b))]}
        answer = httpx.post(f"{server.url}/v2/models/{FIXED}/infer", json=body, timeout=30)
        assert (answer.status_code, answer.headers.get("retry-after")) == (503, "1"), answer.text
        time.sleep(0.3)  # every queued request waits at least this long from here
        ok(held.release())
        for future in futures:
            if future not in refused:
                ok(future)
    after = check_status(server, FIXED, before, {8: 2}, 9, 16, (2,), fail_cnt=3)
    assert after.queue_ns - before.queue_ns >= 8 * 0.3e9
    assert failures(server, FIXED, "queue_full") - refused_before == 3


def timed_out(ex: BaseException, seconds: str) -> None:
    """A request refused for its timeout, as zoo answers it (Triton: UNAVAILABLE, "Request
    timeout expired")."""
    assert status(ex) in ("503", "StatusCode.UNAVAILABLE"), ex
    assert ex.message().startswith("request timeout expired: model "), ex.message()
    assert f"did not answer within {seconds} s" in ex.message(), ex.message()


@on("policy")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_policy_reject(server, protocol):
    # Triton: test_policy_reject (default_timeout_microseconds 100 ms, REJECT; delay 10 s,
    # preferred [4, 8]): 1 row waits for company, times out and is rejected; then 2 + 2 rows
    # form the preferred size 4 and run at once. The rejection is counted (Triton:
    # nv_inference_request_failure{reason="REJECTED"}; zoo: reason "timeout", and `fail`).
    before, rejected_before = snapshot(server, FIXED), failures(server, FIXED, "timeout")
    with pytest.raises(InferenceServerException) as info:
        infer(server, FIXED, 1, protocol=protocol)
    timed_out(info.value, f"{POLICY_TIMEOUT:g}")
    with ThreadPoolExecutor(2) as pool:  # in either order: 2, then 2 more make the preferred 4
        for future in [pool.submit(infer, server, FIXED, 2, protocol=protocol, seed=k) for k in (1, 2)]:
            ok(future)
    check_status(server, FIXED, before, {4: 1}, 2, 4, (1,), fail_cnt=1)
    assert failures(server, FIXED, "timeout") - rejected_before == 1


@on("policy")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_timeout_override(server, protocol):
    # Triton: test_timeout_override (allow_timeout_override, default 1 s): a request's own
    # timeout shorter than the default (100 ms) applies; one longer (10 s) does not, the
    # default does ("capped by --request-timeout"). Each time the 1-row request is rejected and
    # 2 + 2 rows then run as the preferred size 4.
    before = snapshot(server, FIXED)
    for timeout_us, applies in ((100_000, "0.1"), (10_000_000, f"{POLICY_TIMEOUT:g}")):
        with pytest.raises(InferenceServerException) as info:
            infer(server, FIXED, 1, protocol=protocol, timeout_us=timeout_us)
        timed_out(info.value, applies)
        with ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(infer, server, FIXED, 2, protocol=protocol, seed=k) for k in (1, 2)]:
                ok(future)
    check_status(server, FIXED, before, {4: 2}, 4, 8, (2,), fail_cnt=2)


@on("policy")
def test_timeout_override_pending_requests(server):
    # Triton: test_timeout_override, as it sends them: 1 row, then 2 + 2 while it still waits:
    # 1 + 2 + 2 = 5 never passes through a preferred size (1, 3, 5), so all wait; the first is
    # rejected at its timeout (here its own, 0.5 s: the others keep half their default 1 s), and
    # the 2 + 2 then run as a batch of 4.
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(infer, server, FIXED, 1, timeout_us=500_000)
        wait_queued(server, FIXED, 1, [first])
        others = [pool.submit(infer, server, FIXED, 2, seed=1)]
        wait_queued(server, FIXED, 2, [first, *others])
        others.append(pool.submit(infer, server, FIXED, 2, seed=2))
        with pytest.raises(InferenceServerException) as info:
            first.result(60)
        timed_out(info.value, "0.5")
        for future in others:
            ok(future)
    check_status(server, FIXED, before, {4: 1}, 2, 4, (1,), fail_cnt=1)


@on("policy")
def test_default_queue_policy_timeout_prompt_response(server):
    # Triton: queue_timeout_test.py, test_default_queue_policy_timeout_prompt_response (default
    # timeout 1 s; the model busy for 8 s): a queued request is answered at its timeout while
    # the model is still busy, not once a slot frees. zoo's timeout covers the request's whole
    # stay (docs/serving.md, "Parameters"), so the busy request itself is answered 503 "request
    # timeout expired" too (Triton: answered when done).
    before = snapshot(server, FIXED)
    with ThreadPoolExecutor(2) as pool:
        held = Held(server, pool, FIXED, 4, protocol="grpc")
        queued = pool.submit(infer, server, FIXED, 1, protocol="grpc", seed=1)
        with pytest.raises(InferenceServerException) as info:
            queued.result(60)
        assert held.held.exists(), "answered only once the model was free"
        timed_out(info.value, f"{POLICY_TIMEOUT:g}")
        with pytest.raises(InferenceServerException) as info:
            held.future.result(60)
        timed_out(info.value, f"{POLICY_TIMEOUT:g}")
        held.release()
    # the held batch still runs to its end, and is counted as an execution of 4 rows
    wait_for(lambda: snapshot(server, FIXED).execution == before.execution + 1, "the held execution to end")
    after = snapshot(server, FIXED)
    assert after.fail - before.fail == 2 and after.success == before.success
    assert after.calls[len(before.calls):] == [4] and after.inference == before.inference
