"""CUDA graphs for a compiled model, one per input shape: capture once, then replay.

A CUDA graph records the kernels of one call and replays them with a single launch, so a
call costs one copy per input, one replay and one copy per output, however many kernels
the model has, and none of Python, Dynamo's guards or Inductor's wrapper runs again
(https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-graphs). A graph is valid for
the shapes and memory addresses it was captured with, so `CudaGraphs` keeps one graph per
distinct input shape (batch size, sequence length ...) with static input buffers, and
follows the "whole-network capture" recipe of those notes: warm up on a side stream (a
first call may compile or autotune, which capture forbids), capture with
`torch.cuda.graph`, then per call `copy_` the inputs into the static buffers and `replay()`.

Why not Inductor's own CUDA graphs (`triton.cudagraphs`, "CUDAGraph Trees",
https://docs.pytorch.org/docs/stable/torch.compiler_cudagraph_trees.html)? In torch 2.13
they also record one graph per distinct size of a dynamic graph
(`torch._inductor.cudagraph_trees.cudagraphify_impl` keys on the symbolic sizes unless
`triton.cudagraph_skip_dynamic_graphs` is set), but they keep their state per Python
thread (a server's worker threads would each record again), re-run Dynamo's guards and
the tree's bookkeeping in Python on every call, and say which shapes they captured only in
logs. Here capture is explicit, happens at load time for the batch sizes asked, and every
captured and refused shape is listed (`captured`, `uncaptured`).

Memory: all graphs share one private memory pool, captured largest batch first so that
smaller graphs fit in the blocks the largest one left (as vLLM does). The notes call a
shared pool safe when graphs replay in capture order and never concurrently; the order
matters only for a graph's outputs, which later replays of another graph may overwrite.
Here every replay is followed by a clone of its outputs before the lock is released, and
replays are serialized, so no output of a replay is read after another replay. The
clones, input copies and replays are queued on the caller's current stream; callers on
different streams must synchronize them (every thread uses the default stream unless it
sets another).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import torch

from zoo.errors import first_line


#: warm-up calls before each capture; the notes use a few, Inductor's trees one
WARMUP_CALLS = 2
#: shapes captured at most; later new shapes run the compiled code without a graph (and
#: are listed in `uncaptured`): a server that batches dynamically sees up to max-batch
#: shapes per length, and each graph keeps its own input and output buffers
MAX_GRAPHS = 64


def shape_key(args: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
    """What a graph is captured for: the shape of every input (dtype and device are fixed
    by the runner)."""
    return tuple(tuple(a.shape) for a in args)


class _Graph:
    """One captured graph: its static inputs, the outputs it writes, and how to rebuild
    the callable's result (a tensor, a tuple or a dict of tensors) from them."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list[torch.Tensor], result: Any,
                 record: dict[str, Any]) -> None:
        self.graph, self.inputs, self.record = graph, inputs, record
        self.outputs, self.rebuild = _flatten(result)

    def replay(self, args: Sequence[torch.Tensor]) -> Any:
        for static, arg in zip(self.inputs, args):
            static.copy_(arg)  # also casts dtype and converts layout to what was captured
        self.graph.replay()
        self.record["replays"] += 1
        # the outputs live in the graph's pool: the next replay would overwrite them
        return self.rebuild([out.clone() for out in self.outputs])


class CudaGraphs:
    """Runs `fn` through one CUDA graph per input shape, capturing a new shape on first use.

    `cast` turns a caller's tensor into what `fn` was compiled for (dtype, memory layout);
    the static buffers hold that form, and `copy_` into them does the same conversion.
    """

    def __init__(self, fn: Callable[..., Any], cast: Callable[[torch.Tensor], torch.Tensor], device: str,
                 max_graphs: int = MAX_GRAPHS) -> None:
        self.fn, self.cast, self.max_graphs = fn, cast, max_graphs
        self.device = torch.device(device)
        self.graphs: dict[tuple[tuple[int, ...], ...], _Graph] = {}
        #: one entry per graph: {"shapes": [[...], ...], "seconds": warm-up and capture, "replays": n}
        self.captured: list[dict[str, Any]] = []
        #: shapes run without a graph: {"shapes": ..., "reason": why}
        self.uncaptured: list[dict[str, Any]] = []
        self._refused: set[tuple[tuple[int, ...], ...]] = set()
        self._lock = threading.Lock()
        self._pool = None  # created with the first capture, on the device
        self._stream = None  # one capture stream: the note on `torch.cuda.graph`'s `pool` asks for the same one

    def __call__(self, *args: torch.Tensor) -> Any:
        key = shape_key(args)
        with self._lock, torch.cuda.device(self.device):
            graph = self.graphs.get(key)
            if graph is None and key not in self._refused:
                graph = self._capture(key, args)
            if graph is None:
                return self.fn(*(self.cast(a) for a in args))
            return graph.replay(args)

    def capture(self, examples: Sequence[Sequence[torch.Tensor]]) -> None:
        """Capture a graph for each example's shapes, largest first (see the module
        docstring on the shared pool)."""
        with self._lock, torch.cuda.device(self.device):
            for args in sorted(examples, key=lambda a: sum(t.numel() for t in a), reverse=True):
                key = shape_key(args)
                if key not in self.graphs and key not in self._refused:
                    self._capture(key, args)

    def _capture(self, key: tuple[tuple[int, ...], ...], args: Sequence[torch.Tensor]) -> _Graph | None:
        shapes = [list(s) for s in key]
        if len(self.graphs) >= self.max_graphs:
            self._refuse(key, shapes, f"{self.max_graphs} shapes are captured already (the limit)")
            return None
        start = time.perf_counter()
        if self._pool is None:
            self._pool, self._stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream(self.device)
        inputs = [self.cast(a).clone() for a in args]  # owned buffers, in the compiled dtype and layout
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm up off the default stream, as the notes ask
            for _ in range(WARMUP_CALLS):
                self.fn(*inputs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph, caller = torch.cuda.CUDAGraph(), torch.cuda.current_stream(self.device)
        try:
            # "thread_local": other threads (another model, a server's I/O) may allocate
            # while this one captures; Inductor's trees capture the same way
            with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
                result = self.fn(*inputs)
        except Exception as exc:  # a host sync or a CPU op in the compiled code: no graph for it
            # `torch.cuda.graph.__exit__` restores the caller's stream only after a capture
            # that ended cleanly; an invalidated one raises first
            torch.cuda.set_stream(caller)
            self._end_routing()
            self._refuse(key, shapes, f"capture failed: {first_line(exc)}")
            return None
        torch.cuda.current_stream(self.device).wait_stream(stream)
        record = {"shapes": shapes, "seconds": round(time.perf_counter() - start, 3), "replays": 0}
        self.captured.append(record)
        self.graphs[key] = captured = _Graph(graph, inputs, result, record)
        return captured

    def _end_routing(self) -> None:
        """After a failed capture, route allocations back out of the private pool.

        `CUDAGraph::capture_end` ends the caching allocator's routing to the graph's pool
        (`endAllocateToPool`) only after `cudaStreamEndCapture` succeeded; an invalidated
        capture throws first, and every later allocation on the capture stream would land
        in the pool (issue 17, finding 4). Where it did end, the allocator says "not
        currently recording" and nothing is left to do."""
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        with contextlib.suppress(RuntimeError):
            torch._C._cuda_endAllocateToPool(index, self._pool)

    def _refuse(self, key: tuple[tuple[int, ...], ...], shapes: list[list[int]], reason: str) -> None:
        self._refused.add(key)
        self.uncaptured.append({"shapes": shapes, "reason": reason})


def _flatten(result: Any) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], Any]]:
    """The tensors of a model's result and a function that rebuilds its structure."""
    if isinstance(result, torch.Tensor):
        return [result], lambda ts: ts[0]
    if isinstance(result, Mapping):
        names = list(result)
        return [result[n] for n in names], lambda ts: dict(zip(names, ts))
    if isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
        return list(result), tuple
    raise TypeError(f"a CUDA graph's callable must return tensors, a tuple or a dict of them; got {type(result)}")

