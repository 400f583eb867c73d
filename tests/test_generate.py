"""`zoo generate` / `zoo.generate` on the odd inputs a user types: a prompt that is not
UTF-8, a negative seed, a temperature near zero. Each is a one-line error or a result,
never an internal error."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

import zoo
from zoo.errors import InputError


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    spec = zoo.get_model("gpt.pydoc").tiny()
    path = tmp_path_factory.mktemp("gpt") / "gpt"
    zoo.Checkpoint(spec.name, dict(spec.config), spec.build().state_dict()).save(path)
    spec, fn, _ = zoo.predictor(spec.name, checkpoint=path)
    return spec, fn, path


def test_a_prompt_that_is_not_utf8_is_an_input_error(gpt):
    spec, fn, _ = gpt
    # how Python hands over argv bytes that are not UTF-8 (PEP 383)
    with pytest.raises(InputError, match="not valid UTF-8"):
        zoo.generate(spec, fn, b"caf\xe9".decode("utf-8", "surrogateescape"), 2)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_a_seed_numpy_cannot_take_is_an_input_error(gpt, seed):
    spec, fn, _ = gpt
    with pytest.raises(InputError, match="seed must be an integer >= 0"):
        zoo.generate(spec, fn, "abc", 2, temperature=1.0, seed=seed)


def test_a_tiny_temperature_samples_greedily_without_warnings(gpt):
    spec, fn, _ = gpt
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert zoo.generate(spec, fn, "abc", 3, temperature=1e-310) == zoo.generate(spec, fn, "abc", 3)


def test_generation_stops_at_a_stop_token_which_is_not_in_the_text(gpt):
    # before: a model's end-of-sequence token was generated past, and the text after it joined on
    import dataclasses

    spec, fn, _ = gpt
    contexts = []

    def spy(inputs):
        contexts.append(list(inputs["tokens"][0]))
        return fn(inputs)

    zoo.generate(spec, spy, "abc", 8)
    generated = contexts[-1][len(contexts[0]):]  # the last call's context: the prompt and 7 new tokens
    stop = generated[3]
    first = generated.index(stop)
    stopping = dataclasses.replace(spec, stop_tokens=(stop,))
    contexts.clear()
    assert zoo.generate(stopping, spy, "abc", 8) == spec.detokenize(generated[:first])
    assert len(contexts) == first + 1  # no token generated after it
    with pytest.raises(zoo.ZooError, match="stop_tokens must be token ids"):
        dataclasses.replace(spec, stop_tokens=(-1,))


def test_the_cli_says_what_was_wrong_in_one_line(gpt, tmp_path):
    spec, _, path = gpt
    env = {**os.environ, "ZOO_DEBUG": ""}
    # a bad prompt is a bad input (exit 1); a setting no run can use a usage error (exit 2)
    for args, message, code in (([os.fsencode("-p"), b"caf\xe9"], "not valid UTF-8", 1),
                                (["-p", "abc", "--temperature", "1", "--seed", "-1"], "seed must be an integer >= 0",
                                 2),
                                (["-p", "abc", "--temperature", "-1"], "--temperature must be a finite number >= 0", 2),
                                # greedy decoding draws nothing: the seed was ignored silently
                                (["-p", "abc", "--seed", "3"], "--seed does nothing at --temperature 0", 2)):
        result = subprocess.run([sys.executable, "-m", "zoo", "generate", spec.name, "--checkpoint", str(path),
                                 "-n", "2", *args], capture_output=True, cwd=tmp_path, env=env, timeout=300)
        stderr = result.stderr.decode(errors="replace").strip()
        assert result.returncode == code and stderr.startswith("error: ") and message in stderr, stderr
        assert len(stderr.splitlines()) == 1, stderr
