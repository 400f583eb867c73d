"""`zoo bench --url` with more rows per request than the served model takes: a usage
error (exit 2) naming the limit the server gives (its config's max_batch_size), before
any load, not a sweep of requests each answered 400 (exit 1). A real `zoo serve`."""

from __future__ import annotations

import httpx
import pytest

import zoo
from zoo.errors import UsageError
from zoo.serve import perf

pytest.register_assert_rewrite("serve_support")
from serve_support import DIGITS, ONNX  # noqa: E402

pytest_plugins = ["serve_support"]


def infer_answers(server) -> float:
    """The server's count of answers to HTTP inference requests, from its /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("zoo_http_responses_total{") and "/infer" in line)


def test_rows_beyond_the_models_max_batch_size_are_refused_before_any_load(server):
    from typer.testing import CliRunner

    from zoo.cli import app

    most = zoo.get_model(DIGITS).tiny().axes["batch"].max
    before = infer_answers(server)
    done = CliRunner().invoke(app, ["bench", DIGITS, "--model-name", ONNX, "--url", server.url, "--batch-sizes",
                                    f"1,{most + 1}", "--concurrency", "1", "--min-time", "0.3"])
    assert isinstance(done.exception, UsageError) and done.exception.exit_code == 2, (done.exception, done.output)
    assert f"--batch-sizes {most + 1}: {ONNX} at {server.url} takes at most {most} rows per request" in str(
        done.exception)
    assert infer_answers(server) == before  # no request was sent
    assert perf.most_rows(perf.target(server.url), ONNX) == most
