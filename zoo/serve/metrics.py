"""Prometheus metrics for `GET /metrics`.

Per model: requests and failures (by reason), end-to-end request latency in the server,
queue time, compute time (the runner call of the batch the request rode in), and batch
sizes; per HTTP route and gRPC method: responses by status code. On a machine with an NVIDIA GPU, the
GPU's utilization and memory are read through NVML (the `nvidia-ml-py` package) at each
scrape, as Triton's `nv_gpu_utilization` and `nv_gpu_memory_used_bytes` are.

Each application gets its own `CollectorRegistry`, so several servers in one process
(tests) do not collide.
"""

from __future__ import annotations

import logging
from typing import Iterator, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("zoo.serve")
#: seconds: 50 us to 30 s, dense where CPU models answer (0.2 to 20 ms)
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 0.01, 0.015, 0.02, 0.03, 0.05,
                   0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self, gpu: bool = True) -> None:
        self.registry = CollectorRegistry()
        labels = ("model", "version")
        self.requests = Counter("zoo_inference_requests", "Inference requests received, by model.", labels,
                                registry=self.registry)
        self.failures = Counter("zoo_inference_failures", "Inference requests that failed, by model and reason "
                                "(bad_request, queue_full, not_ready, backend, timeout, cancelled, disconnected, "
                                "internal).",
                                (*labels, "reason"), registry=self.registry)
        self.latency = Histogram("zoo_inference_request_duration_seconds", "Time in the server per successful "
                                 "request: body read to response encoded.", labels, buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.queue = Histogram("zoo_inference_queue_duration_seconds", "Time a request waited for its batch to "
                               "start.", labels, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.compute = Histogram("zoo_inference_compute_duration_seconds", "Time in the model (the runner call) "
                                 "of the batch a request rode in.", labels, buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.batch_size = Histogram("zoo_inference_batch_size", "Rows per batch sent to an instance.", labels,
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.executions = Counter("zoo_inference_executions", "Batches sent to an instance (a ragged batch "
                                  "whose sizes spread runs as several padding-group executions).", labels,
                                  registry=self.registry)
        self.queue_depth = Gauge("zoo_inference_queue_depth", "Requests waiting for an instance.", labels,
                                 registry=self.registry)
        self.ready = Gauge("zoo_model_ready", "1 when the model takes requests.", labels, registry=self.registry)
        self.http = Counter("zoo_http_responses", "HTTP responses by route template and status code.",
                            ("route", "code"), registry=self.registry)
        self.grpc = Counter("zoo_grpc_responses", "gRPC responses by method and status code.",
                            ("method", "code"), registry=self.registry)
        #: (metric, label values) -> the labelled child: `labels()` validates and locks on
        #: every call (about 12 us), several times per request; children are never removed
        self._children: dict[tuple[int, tuple[str, ...]], object] = {}
        self.gpu = GpuCollector.create() if gpu else None
        if self.gpu is not None:
            self.registry.register(self.gpu)

    def child(self, metric, *labels: str):
        """`metric.labels(*labels)`, looked up once per label set."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def observe_batch(self, model: str, version: str, rows: int) -> None:
        self.child(self.batch_size, model, version).observe(rows)
        self.child(self.executions, model, version).inc()

    def observe_request(self, model: str, version: str, total: float, queue: float, compute: float) -> None:
        self.child(self.latency, model, version).observe(total)
        self.child(self.queue, model, version).observe(queue)
        self.child(self.compute, model, version).observe(compute)

    def exposition(self, models: Sequence) -> tuple[bytes, str]:
        for m in models:
            self.queue_depth.labels(m.name, m.version).set(m.batcher.depth if m.batcher else 0)
            self.ready.labels(m.name, m.version).set(1 if m.ready else 0)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class GpuCollector(Collector):
    """GPU utilization and memory per device, read through NVML at scrape time."""

    def __init__(self, pynvml) -> None:
        self.nvml = pynvml

    @classmethod
    def create(cls) -> "GpuCollector | None":
        """A collector when NVML starts (a driver and a GPU are present), else None."""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() == 0:
                return None
        except Exception as exc:  # no package, no driver, no device: no GPU metrics, said once
            log.info("no GPU metrics: %s", exc)
            return None
        return cls(pynvml)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nvml = self.nvml
        util = GaugeMetricFamily("zoo_gpu_utilization_ratio", "GPU busy fraction over the last sample period "
                                 "(NVML).", labels=["gpu", "name"])
        used = GaugeMetricFamily("zoo_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=["gpu", "name"])
        total = GaugeMetricFamily("zoo_gpu_memory_total_bytes", "GPU memory in all (NVML).", labels=["gpu", "name"])
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(handle)
                name = name.decode() if isinstance(name, bytes) else name
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                util.add_metric([str(i), name], rates.gpu / 100.0)
                used.add_metric([str(i), name], float(memory.used))
                total.add_metric([str(i), name], float(memory.total))
        except Exception as exc:  # a GPU that fell off the bus must not break /metrics
            log.warning("NVML read failed: %s", exc)
        yield from (util, used, total)
