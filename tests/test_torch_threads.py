"""`threads` holds for the PyTorch backends in every thread that calls a runner, not only
the one that loaded it.

torch's thread count is one per process, but OpenMP's (`omp_get_max_threads`, what
libgomp starts a parallel region with) is per thread: `torch.set_num_threads` sets it
in the calling thread only, and a new thread starts at OpenMP's default (all cores, or
$OMP_NUM_THREADS). An AOTInductor package built with `cpp.dynamic_threads` runs bare
`#pragma omp parallel` regions, so called from a `zoo serve` worker thread it ran on
every core whatever `threads` said, and `--instances N` oversubscribed N-fold.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
import torch

import zoo

#: the OpenMP runtime torch's CPU wheels load (found by its soname: the copy already loaded)
_GOMP = ctypes.CDLL("libgomp.so.1")


def _in_a_new_thread(fn):
    """`fn()`'s result, called in a thread of its own."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", fn()))
    thread.start()
    thread.join()
    return result["value"]


@pytest.mark.parametrize("backend", ["torch", "torch-compile", "torch-aoti"])
def test_threads_hold_in_a_thread_other_than_the_loaders(backend, tmp_path):
    spec = zoo.get_model("ppo.cartpole").tiny()
    art = zoo.export(spec, backend, repository=tmp_path, random_init=True)
    default = _in_a_new_thread(_GOMP.omp_get_max_threads)  # what a new thread starts with here
    threads = 1 if default > 1 else 2  # not the default, so that holding it is the runner's doing
    saved = torch.get_num_threads()
    try:
        runner = zoo.load(art.path, threads=threads)
        inputs = spec.sample(spec.axes["batch"].max, np.random.default_rng(0))

        def call():
            runner(inputs)
            return _GOMP.omp_get_max_threads()

        assert _in_a_new_thread(call) == threads
        torch.set_num_threads(saved)  # another model, or the process, set another count
        assert _in_a_new_thread(call) == threads
    finally:
        torch.set_num_threads(saved)
