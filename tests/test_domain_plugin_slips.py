"""A domain plugin's slips in its preprocess and postprocess (tests/user_plugins/
slipped_domain.py), named as the plugin's, the same by `zoo predict` and by a server: rows
that are not one per item, a missing input, no dict at all, fewer results than items (once
answered 200 with the results of other items, or none, without a word), a result JSON
cannot hold; text items that are not UTF-8 refused before the plugin sees them."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

import zoo
from zoo import registry
from zoo.errors import InputError, PluginError
from zoo.predict import predict, predictor

from serve_support import ServerProcess

PLUGIN = Path(__file__).parent / "user_plugins" / "slipped_domain.py"
MODEL = "gc.slipped"

SLIPS = {  # items -> what the plugin did, in the words both report
    ("rows",): "its preprocess made 3 rows of 'onehot' for 1 item; it makes one row per item",
    ("missing", "ACGT"): "its preprocess returned no ['onehot'] (it gave [])",
    ("nothing",): "its preprocess returned a NoneType, not a dict of its inputs by name",
    ("fewer", "ACGT"): "its postprocess returned 0 results for 2 items; it returns one per item",
    ("set",): "its postprocess's result for item 1 is not JSON (Object of type set is not JSON serializable): a "
              "result is made of strings, numbers, booleans, None, lists and dicts",
}


@pytest.fixture(scope="module")
def loaded():
    registry.load_plugin_file(PLUGIN)
    try:
        yield predictor(MODEL)
    finally:
        registry.unload_plugin_file(PLUGIN)


@pytest.mark.parametrize("items", SLIPS, ids=lambda items: items[0])
def test_zoo_predict_names_the_plugins_slip(loaded, items):
    spec, fn, _ = loaded
    with pytest.raises(PluginError) as refused:
        predict(spec, fn, list(items))
    assert str(refused.value) == f"model {MODEL}: {SLIPS[items]}"


@pytest.mark.parametrize("cue, failure", [("raises", "its preprocess failed: ValueError: a base table that was never "
                                                     "filled"),
                                          ("failing", "its postprocess failed: RuntimeError: a label table that was "
                                                      "never filled")])
def test_an_exception_in_the_plugins_code_is_named_as_its_own(loaded, cue, failure):
    spec, fn, _ = loaded
    with pytest.raises(PluginError, match=f"^model {MODEL}: {failure}$"):
        predict(spec, fn, [cue])


def test_results_are_plain_json_values_locally_as_from_a_server(loaded):
    spec, fn, _ = loaded
    results = predict(spec, fn, ["numpy", "ACGT"])
    assert [type(r["gc"]) for r in results] == [float, float] and [type(r["class"]) for r in results] == [int, int]
    plain = predict(spec, fn, ["ACGT", "ACGT"])
    np.testing.assert_allclose([r["gc"] for r in results], [r["gc"] for r in plain], atol=1e-6)


@pytest.mark.parametrize("item, message", [("AC\udcff", "item 1 is not valid UTF-8"),
                                           (b"AC\xff", "dna item 1 is not valid UTF-8")])
def test_text_that_is_not_utf8_is_the_callers_error(loaded, item, message):
    spec, fn, _ = loaded
    with pytest.raises(InputError, match=f"^{message}$"):
        predict(spec, fn, [item])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("slips") / "exports"
    registry.load_plugin_file(PLUGIN)
    try:
        zoo.export(MODEL, "onnxruntime", repository=root, random_init=True)
    finally:
        registry.unload_plugin_file(PLUGIN)
    proc = ServerProcess(root, log=tmp_path_factory.mktemp("server") / "server.log", plugins=[PLUGIN])
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


def infer(server, items):
    body = {"inputs": [{"name": "dna", "datatype": "BYTES", "shape": [len(items)], "data": list(items)}]}
    return httpx.post(f"{server.url}/v2/models/{MODEL}.onnxruntime.fp32/infer", json=body, timeout=30)


@pytest.mark.parametrize("items", SLIPS, ids=lambda items: items[0])
def test_a_server_answers_the_plugins_slip_as_its_error_and_stays_up(server, items):
    answer = infer(server, items)
    assert answer.status_code == 500 and answer.json() == {"error": f"model {MODEL}: {SLIPS[items]}"}
    good = infer(server, ["ACGT", "GGCC"])  # the next request, answered as ever
    assert good.status_code == 200, good.text
    assert [json.loads(r)["gc"] for r in good.json()["outputs"][0]["data"]] == pytest.approx([0.25, 0.5], abs=1e-6)
