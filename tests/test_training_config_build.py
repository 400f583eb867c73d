"""A `--config` value the model's build fails on is the model's failure, said in one line
naming the model, its config and the error: `zoo train resnet8.digits -c width=-4` was an
"internal error: Trying to create tensor with negative dimension -4"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import zoo
from zoo.errors import PluginError
from zoo.training import TrainOptions


def test_a_config_the_build_fails_on_is_one_line_naming_the_model_and_config(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ZOO_DEBUG", None)
    done = subprocess.run([sys.executable, "-m", "zoo", "train", "resnet8.digits", "-c", "width=-4", "--out",
                           str(tmp_path / "cfg"), "--max-steps", "1"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "internal error" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith("error: model resnet8.digits (plugin zoo-vision (vision)) failed to build: Trying "
                                "to create tensor with negative dimension -4"), errors[0]
    assert errors[0].endswith("; config width=-4 (registered: width=32)"), errors[0]


def test_the_api_names_the_config_too(tmp_path):
    spec = zoo.get_model("resnet8.digits").tiny().configure(width=-4)
    says = r"failed to build: .*negative dimension.*; config width=-4 \(registered: width=32\)$"
    with pytest.raises(PluginError, match=says):
        zoo.train(spec, out=tmp_path / "run", progress=False, options=TrainOptions(max_steps=1))
    assert not (tmp_path / "run" / "last").exists()
