"""`zoo serve`: the model repository that `zoo export` writes, served over the Open
Inference Protocol ("v2", as NVIDIA Triton and KServe speak it) with dynamic batching.

    protocol.py    v2 requests and responses: JSON tensors, the binary tensor extension
    datatypes.py   v2 datatypes <-> numpy, and the raw bytes of each
    batcher.py     dynamic (and ragged) batching onto worker-thread instances
    model.py       one served artifact: validation, domain-native inputs, recovery
    service.py     what both front ends share: the models, inference, index, load/unload, statistics
    grpc_service.py  the same over gRPC (Triton's GRPCInferenceService, grpcio's asyncio server)
    stats.py       Triton's statistics extension: counts and cumulative durations per model
    classify.py    Triton's classification extension: the top K classes of an output
    shm.py         Triton's system shared memory extension: registered regions, checked reads/writes
    repository.py  which artifacts load here, which are skipped and why
    metrics.py     Prometheus metrics, GPU utilization and memory through NVML
    errors.py      the one table from exception type to HTTP status (and, through it, gRPC code)
    app.py         the Starlette application: routes, lifespan, request-size guard
    server.py      uvicorn with graceful shutdown
    perf.py        a concurrency-sweep load generator (`zoo bench --url`)
"""
