"""`zoo bench --url` when the sweep is cut short: a server killed during a point (over
HTTP, gRPC and a gRPC stream) and Ctrl-C. Either way the points measured before are
shown and written (--output), as perf_analyzer reports a failed point and the matrix
keeps its finished rows; a killed server is a failed point with its reason (exit 1),
Ctrl-C a report marked interrupted (exit 130). A real `zoo serve` and real clients:
`_scrape` (called before and after each point's measured run) only says when."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from zoo.serve import perf

pytest.register_assert_rewrite("serve_support")
from serve_support import DIGITS, ONNX, ServerProcess  # noqa: E402

pytest_plugins = ["serve_support"]


@pytest.fixture
def doomed(serve_repo, tmp_path):
    """A server of this test's own, to be killed."""
    proc = ServerProcess(serve_repo, log=tmp_path / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


def during_the_second_point(monkeypatch, act) -> None:
    """`act()` 0.3 s into the second point's measured run (its 1.5 s)."""
    scrape, calls = perf._scrape, []

    def scraped(http, model):
        calls.append(http)
        if len(calls) == 3:
            threading.Timer(0.3, act).start()
        return scrape(http, model)

    monkeypatch.setattr(perf, "_scrape", scraped)


def bench(*args: str):
    from typer.testing import CliRunner

    from zoo.cli import app

    return CliRunner().invoke(app, ["bench", DIGITS, "--model-name", ONNX, "--concurrency", "1,2,4", "--min-time",
                                    "1.5", *args], terminal_width=250)


@pytest.mark.parametrize("protocol", ["http", "grpc", "streaming"])
def test_a_server_killed_mid_sweep_fails_its_point_and_keeps_the_ones_before(doomed, tmp_path, monkeypatch,
                                                                           protocol):
    during_the_second_point(monkeypatch, doomed.kill)
    url = doomed.url if protocol == "http" else f"grpc://{doomed.grpc_url}"
    extra = () if protocol == "http" else ("--metrics-url", doomed.url, *(("--streaming",) * (protocol == "streaming")))
    done = bench("--url", url, *extra, "--output", str(tmp_path / "r.json"))
    assert done.exit_code == 1, (done.exception, done.output)
    assert "Aborted" not in done.output and "the sweep stopped there" in done.output, done.output
    first, second = json.loads((tmp_path / "r.json").read_text())["results"]  # nothing after the failed point
    assert first["concurrency"] == 1 and first["errors"] == 0 and first["requests"] > 0 and not first["failed"]
    assert second["concurrency"] == 2 and second["errors"] > 0 and second["failed"]
    if protocol == "http":  # the clients saw the connection close; gRPC's see UNAVAILABLE, /metrics no answer
        assert second["failed"] == second["first_error"] == "the server closed the connection"
    else:
        assert second["first_error"].startswith("UNAVAILABLE"), second["first_error"]
        assert second["failed"] == f"the server stopped answering at {doomed.url}"


def test_ctrl_c_mid_sweep_writes_the_finished_points_and_exits_130(server, tmp_path, monkeypatch):
    during_the_second_point(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGINT))
    done = bench("--url", server.url, "--output", str(tmp_path / "r.json"))
    assert done.exit_code == 130, (done.exception, done.output)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["interrupted"] is True
    [point] = report["results"]
    assert point["concurrency"] == 1 and point["errors"] == 0 and point["requests"] > 0
    assert "interrupted: the points above finished before it" in done.output
