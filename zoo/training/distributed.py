"""Several processes, one run: DistributedDataParallel as launched by `torchrun`.

`torchrun --nproc-per-node N -m zoo train MODEL ...` (or its shortcut `zoo train
--nproc N`, which execs exactly that) starts N copies of the same command with RANK,
WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT set; each joins the process group (gloo on
CPU, NCCL on CUDA). Multi-host runs are the same command on every host with `--nnodes`
and a rendezvous endpoint, torchrun's job.

The recipe's batch size is the *global* batch: every process draws the same seeded
permutation of the epoch, each of N processes takes every N-th example of each global
batch (`loop.shard`, with its loss weighted so uneven last batches count right), and DDP
averages the gradients, so N processes take the same steps as one process with the whole
batch, up to float summation order (BatchNorm statistics and augmentation draws are per
process). Rank 0 alone writes checkpoints, logs and the progress bar.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from ..errors import Terminated, UsageError, ZooError, debugging


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def device(self, device: str) -> str:
        """This process's device: `cuda` becomes `cuda:<local rank>` under torchrun."""
        if self.distributed and device == "cuda":
            return f"cuda:{self.local_rank}"
        return device

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def from_main(self, value: float | None) -> float | None:
        """Rank 0's `value` on every process (None travels as NaN, and NaN comes back None).
        Ranks validating their own replica can disagree: DDP broadcasts BatchNorm buffers
        at each forward, so after the epoch's last step every rank holds its own running
        statistics; a stop decided per rank left one rank training against a process group
        the other had closed ("Connection closed by peer")."""
        if not self.distributed:
            return value
        t = torch.tensor([math.nan if value is None else float(value)], dtype=torch.float64)
        dist.broadcast(t, src=0)
        got = float(t.item())
        return None if math.isnan(got) else got

    def gather(self, value: Any) -> list[Any]:
        """Every process's `value` (picklable), in rank order, on every process."""
        if not self.distributed:
            return [value]
        values: list[Any] = [None] * self.size
        dist.all_gather_object(values, value)
        return values

    def all_reduce_sum(self, value: float) -> float:
        """Sum a number over processes (for throughput and loss across ranks)."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())


def init(device: str) -> World:
    """Join the process group torchrun describes in the environment; one process otherwise."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    world = World(int(os.environ["RANK"]), size, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(world.local_rank)
        dist.init_process_group(backend)
    return world


def shutdown(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def check_batch_size(batch_size: int, world: World) -> None:
    if batch_size < world.size:
        raise ZooError(f"a global batch of {batch_size} leaves some of the {world.size} processes without "
                       f"examples: pass --batch-size of at least {world.size}")


#: set in the environment of the processes `zoo train --nproc` starts
LAUNCHED = "ZOO_TRAIN_LAUNCHED"
#: set by `launch` where its own stderr is a terminal: rank 0 draws its progress bar on stdout,
#: which the processes share with the launcher (their stderr is a pipe the launcher reads)
PROGRESS_ON_STDOUT = "ZOO_TRAIN_PROGRESS_ON_STDOUT"


def launch(nproc: int, argv: list[str]) -> tuple[int, bool]:
    """`zoo train --nproc N ...`: run the same command under torchrun on this host.
    (exit status, whether a process printed its error): the processes' output passes
    through, each distinct error line once, and torchrun's own report of a failed process
    (a traceback of the launcher, not of the run) is left out unless ZOO_DEBUG is set. When
    torchrun stopped on a signal that reached it alone (SIGINT, SIGTERM), the status is the
    signal's, 128 + its number, not torchrun's 1."""
    if nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    if "WORLD_SIZE" in os.environ:
        raise UsageError("--nproc starts torchrun itself; under torchrun, leave it out")
    if shutil.which("torchrun") is None and not _has_module("torch.distributed.run"):
        raise ZooError("torchrun is not available in this environment")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "zoo", *argv]
    env = dict(os.environ)
    # torchrun sets one OpenMP thread per process; give each process its share of the cores instead
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env[LAUNCHED] = "1"  # check_launch prepared the run directory: the processes leave it as it is
    if sys.stderr.isatty():
        env[PROGRESS_ON_STDOUT] = "1"
    # torchrun in a session of its own: a signal reaches it from this process only, once (Ctrl-C at a
    # terminal reached both, a SIGINT to this process alone left torchrun training on, unowned); a
    # hangup reaches this process as SIGTERM does, and torchrun gets SIGTERM if this process dies
    with _hangup_terminates(), subprocess.Popen(
            command, env=env, stderr=None if debugging() else subprocess.PIPE, text=True, errors="replace",
            start_new_session=True, preexec_fn=_die_with_parent()) as process:
        try:
            shown, signum = _relay_stderr(process.stderr) if process.stderr is not None else (False, None)
            process.wait()
        except (KeyboardInterrupt, Terminated) as exc:
            _stop(process, signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
            raise
    if signum is not None and process.returncode:  # torchrun ended the processes on a signal, then exited 1
        return 128 + signum, shown
    return process.returncode, shown


def _die_with_parent() -> Callable[[], None] | None:
    """What torchrun's process runs before torchrun (Linux; None elsewhere): SIGTERM to it when
    this process dies (killed, or gone on a signal it does not handle), which torchrun passes
    on to its processes: they trained on, unowned, when SIGKILL ended `zoo` alone. prctl is
    looked up here, so that the child only calls it (no import between fork and exec)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl, sigterm = ctypes.CDLL(None, use_errno=True).prctl, int(signal.SIGTERM)
    return lambda: prctl(1, sigterm)  # PR_SET_PDEATHSIG (prctl(2))


@contextlib.contextmanager
def _hangup_terminates() -> Iterator[None]:
    """SIGHUP and SIGQUIT raise `Terminated` while torchrun runs (a closed terminal or SSH
    session sends SIGHUP, which reached torchrun itself before it had a session of its own),
    so that they stop the run as SIGTERM does: passed on, waited for, the run put back."""
    wanted = [s for s in (getattr(signal, "SIGHUP", None), getattr(signal, "SIGQUIT", None)) if s is not None]
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise Terminated()

    previous = {s: signal.signal(s, terminated) for s in wanted}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop(process: subprocess.Popen, signum: int) -> None:
    """Pass `signum` on to torchrun and wait until it has ended its processes (its report on
    stderr is read and dropped: a full pipe would stop it), so that the caller finds the run
    directory as they left it; a second interrupt meanwhile kills torchrun and its processes
    (each in a session of its own, as torchrun starts them)."""
    try:
        process.send_signal(signum)
        if process.stderr is not None:
            for _ in process.stderr:
                pass
        process.wait()
    except (KeyboardInterrupt, Terminated):
        for pid in (*_children(process.pid), process.pid):
            try:
                os.killpg(pid, signal.SIGKILL)  # its session's group, where it leads one
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        process.wait()


def _children(pid: int) -> list[int]:
    """The processes `pid` started (Linux's /proc; none where it cannot tell)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


#: torchrun's log lines ("E1127 20:42:00.576000 8414 torch/distributed/elastic/...] failed (exitcode: 1) ...")
_TORCHRUN_LOG = re.compile(r"^[DIWE]\d{4} [\d:.]+ +\d+ torch/distributed/")


#: torchrun's line when SIGINT or SIGTERM reached it ("Received 2 death signal, ...", or by name)
_DEATH_SIGNAL = re.compile(r"Received (?:Signals\.)?(SIG[A-Z]+|\d+) death signal")


def _relay_stderr(stream) -> tuple[bool, int | None]:
    """Copy the processes' stderr to ours, each error line once (every rank fails alike), and
    nothing of torchrun's own from its first log line on. Whether an error line came, and
    the signal torchrun said it stopped on (None: none)."""
    seen: set[str] = set()
    launcher = False
    signum = None
    for line in stream:
        launcher = launcher or bool(_TORCHRUN_LOG.match(line))
        death = _DEATH_SIGNAL.search(line) if launcher else None
        if death is not None:
            name = death.group(1)
            signum = int(name) if name.isdigit() else int(getattr(signal, name, signal.SIGTERM))
        is_error = line.startswith(("error:", "internal error:"))
        if launcher or line in seen:
            continue
        if is_error:
            seen.add(line)
        sys.stderr.write(line)
        sys.stderr.flush()
    return bool(seen), signum


def check_launch(spec, options, out: Path, nproc: int) -> None:
    """What each of `nproc` processes would refuse, refused once before torchrun starts them."""
    from .options import run_files
    from .run import prepare_run_directory, restore_set_aside
    from .state import check_resume_point

    if nproc < 1:  # before the directory is prepared, as every refusal here
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    if spec.recipe is not None and spec.trainer is None:
        check_batch_size(options.batch_size or spec.recipe.batch_size, World(0, nproc))
    if options.resume:
        restore_set_aside(out)  # a finished run a killed run had set aside: its resume point is the one to continue
        check_resume_point(run_files(out)["last"])
    prepare_run_directory(spec.name, out, options.resume)  # once, before the processes start


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
