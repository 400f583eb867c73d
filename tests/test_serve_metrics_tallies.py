"""`zoo serve`'s per-request counters and histograms (`zoo.serve.metrics.Tallies`, plain
numbers written at scrape) against prometheus_client's own `Counter` and `Histogram` fed
the same updates: the same exposition, sample for sample, bucket edges included."""

from __future__ import annotations

import random
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from zoo.serve.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, Metrics, Tallies


def _created(text: bytes) -> str:
    """The exposition with creation times (when each label set was first seen) masked."""
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text.decode())


def test_tallies_write_what_prometheus_clients_own_metrics_write():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    tallies = Tallies()
    ours.register(tallies)
    pairs = [
        (Counter("zoo_c", "a counter", ("model", "version"), registry=theirs),
         tallies.counter("zoo_c", "a counter", ("model", "version")), "inc"),
        (Histogram("zoo_latency", "latency", ("model", "version"), buckets=LATENCY_BUCKETS, registry=theirs),
         tallies.histogram("zoo_latency", "latency", ("model", "version"), LATENCY_BUCKETS), "observe"),
        (Histogram("zoo_rows", "rows", ("model", "version"), buckets=BATCH_BUCKETS, registry=theirs),
         tallies.histogram("zoo_rows", "rows", ("model", "version"), BATCH_BUCKETS), "observe"),
    ]
    rng = random.Random(0)
    edges = [*LATENCY_BUCKETS, *BATCH_BUCKETS, 0.0, 1e9]  # exactly on a bound: into that bucket (le)
    for _ in range(3000):
        labels = (rng.choice(["a", "b.c"]), rng.choice(["1", "2"]))
        value = rng.choice([rng.random() * 0.05, rng.random() * 300, rng.choice(edges)])
        for metric, family, update in pairs:
            getattr(metric.labels(*labels), update)(value if update == "observe" else 1)
            getattr(family.child(labels), update)(value if update == "observe" else 1)
    assert _created(generate_latest(ours)) == _created(generate_latest(theirs))
    parsed = {f.name: f for f in text_string_to_metric_families(generate_latest(ours).decode())}
    assert parsed["zoo_latency"].type == "histogram" and parsed["zoo_c"].type == "counter"


def test_a_label_set_of_the_wrong_length_is_refused():
    metrics = Metrics(gpu=False)
    with pytest.raises(ValueError, match="takes labels"):
        metrics.child(metrics.requests, "model-only")


def test_metrics_names_as_the_docs_list_them():
    metrics = Metrics(gpu=False)
    metrics.child(metrics.requests, "m", "1").inc()
    metrics.child(metrics.failures, "m", "1", "timeout").inc()
    metrics.observe_batch("m", "1", 4)
    metrics.observe_request("m", "1", 0.002, 0.001, 0.0005)
    metrics.child(metrics.http, "/v2/models/{model}/infer", "200").inc()
    metrics.child(metrics.grpc, "ModelInfer", "OK").inc()
    text, _ = metrics.exposition([])
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text.decode()) for s in f.samples}
    assert samples[("zoo_inference_requests_total", (("model", "m"), ("version", "1")))] == 1
    assert samples[("zoo_inference_failures_total", (("model", "m"), ("reason", "timeout"), ("version", "1")))] == 1
    assert samples[("zoo_inference_batch_size_bucket", (("le", "4.0"), ("model", "m"), ("version", "1")))] == 1
    assert samples[("zoo_inference_batch_size_bucket", (("le", "2.0"), ("model", "m"), ("version", "1")))] == 0
    assert samples[("zoo_inference_executions_total", (("model", "m"), ("version", "1")))] == 1
    assert samples[("zoo_inference_request_duration_seconds_sum", (("model", "m"), ("version", "1")))] == 0.002
    assert samples[("zoo_inference_queue_duration_seconds_count", (("model", "m"), ("version", "1")))] == 1
    assert samples[("zoo_http_responses_total", (("code", "200"), ("route", "/v2/models/{model}/infer")))] == 1
    assert samples[("zoo_grpc_responses_total", (("code", "OK"), ("method", "ModelInfer")))] == 1
