"""A domain-native input kind that only a plugin knows ("waveform", binary, from
tests/raw_kind_plugin.py) goes through `zoo predict`, the server's BYTES input and zoo's
client exactly as the built-in kinds do, with no core change."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import zoo
from zoo import registry

PLUGIN = Path(__file__).with_name("raw_kind_plugin.py")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    registry.load_plugin_file(PLUGIN)
    try:
        root = tmp_path_factory.mktemp("repo")
        art = zoo.export("loudness.test", "onnxruntime", repository=root, random_init=True)
        yield art, zoo.get_model("loudness.test")
    finally:
        registry.unload_plugin_file(PLUGIN)


def recordings(tmp_path: Path, n: int) -> tuple[list[Path], np.ndarray]:
    waves = np.random.default_rng(7).standard_normal((n, 16)).astype("<f4")
    paths = []
    for i, wave in enumerate(waves):
        paths.append(tmp_path / f"take{i}.raw")
        paths[-1].write_bytes(wave.tobytes())
    return paths, waves


def expected(art: zoo.Artifact, waves: np.ndarray) -> list[dict]:
    loud = zoo.load(art.path)({"waveform": waves})["loudness"][:, 0]
    return [{"loudness": round(float(v), 6)} for v in loud]


def test_predict_reads_binary_items_from_files(exported, tmp_path):
    from typer.testing import CliRunner

    from zoo.cli import app

    art, _ = exported
    paths, waves = recordings(tmp_path, 3)
    result = CliRunner().invoke(app, ["--plugin", str(PLUGIN), "predict", "-", "--artifact", str(art.path),
                                      *map(str, paths), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"] == expected(art, waves)
    short = tmp_path / "short.raw"
    short.write_bytes(b"\0" * 12)
    bad = CliRunner().invoke(app, ["--plugin", str(PLUGIN), "predict", "-", "--artifact", str(art.path),
                                   str(paths[0]), str(short)])
    assert bad.exit_code != 0 and str(bad.exception) == ("waveform item 2 has 12 bytes, not 64 (16 float32 samples) "
                                                         f"(item 2 is {short})")  # the file, as given
    wrong_flag = CliRunner().invoke(app, ["--plugin", str(PLUGIN), "predict", "-", "--artifact", str(art.path),
                                          "--text", "hello"])
    assert "takes waveform inputs, not --text" in str(wrong_flag.exception)


def test_the_server_takes_the_kind_as_a_bytes_input(exported, tmp_path):
    from starlette.testclient import TestClient

    from zoo.client import Client
    from zoo.serve.app import Settings, create_app

    art, _ = exported
    _, waves = recordings(tmp_path, 4)
    registry.load_plugin_file(PLUGIN)  # the server runs the plugin's preprocess, as `zoo serve --plugin` would
    try:
        with TestClient(create_app(Settings(art.path.parent))) as http:
            native = http.get(f"/v2/models/{art.name}").json()["zoo"]["domain_native"]
            assert native["kind"] == "waveform" and native["binary"] is True
            assert native["inputs"] == [{"name": "waveform", "datatype": "BYTES", "shape": [-1]}]
            client = Client("http://testserver")
            client.http = http  # zoo's own client over the in-process server
            assert client.raw_kind(art.name) == "waveform" and client.raw_binary(art.name)
            assert client.predict(art.name, [w.tobytes() for w in waves]) == expected(art, waves)
            with pytest.raises(zoo.ZooError, match="waveform item 1 has 3 bytes"):
                client.predict(art.name, [b"abc"])
    finally:
        registry.unload_plugin_file(PLUGIN)


def test_kind_names_are_checked_not_listed(exported):
    import dataclasses

    _, spec = exported
    assert dataclasses.replace(spec, raw_kind="seismogram").raw_kind == "seismogram"
    with pytest.raises(zoo.ZooError, match="raw_kind 'Wave Form' must be a lowercase name"):
        dataclasses.replace(spec, raw_kind="Wave Form")
    assert spec.to_json()["raw_input"] == "waveform" and spec.to_json()["raw_binary"] is True
