"""One training run's directory and everything it writes: the part every trainer shares.

The supervised loop (`loop.py`) and a plugin's own trainer (the RL plugin's PPO) both
get a `Run`: it knows the seed, epochs, device and options, and it owns the run
directory — the resume point, the selected checkpoint, TensorBoard event files, the
profiler trace, the progress bar and the final metrics JSON. Only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ..checkpoint import META, PENDING, PREVIOUS, Checkpoint, load_checkpoint
from ..errors import CheckpointError, UsageError, ZooError
from ..fsutil import OLD, STAGING, atomic_write_text
from ..spec import ModelSpec
from .distributed import LAUNCHED, PROGRESS_ON_STDOUT, World
from .options import TrainOptions, run_files
from .state import STATE, TrainingState, load_state, save_state

log = logging.getLogger("zoo")
train_log = logging.getLogger("zoo.train")  # `zoo train` prints these as one warning line each
#: what must be equal for a resumed run to follow the interrupted one exactly
RESUME_KEYS = ("seed", "epochs", "batch_size", "accumulate", "val_fraction", "optimizer", "schedule", "lr",
               "weight_decay", "precision", "clip_grad_norm", "patience")
PROFILE_WAIT, PROFILE_WARMUP, PROFILE_ACTIVE = 1, 1, 3
RUN_PARTS = ("model", "last", "metrics", "tensorboard", "trace")  # of run_files: what a finished run holds


def run_owner(out: Path) -> str | None:
    """The model whose run `out` holds (from its checkpoint or resume point), or None."""
    files = run_files(out)
    for meta in (files["model"] / META, files["last"] / STATE):
        try:
            model = json.loads(meta.read_text()).get("model")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(model, str):
            return model
    return None


def prepare_run_directory(model: str, out: Path, resume: bool) -> None:
    """Before a run starts in `out`: refuse a run directory of another model, and set a
    finished run of this model aside (`out/.previous.pending`) rather than overwrite it
    epoch by epoch, so that a new run that fails or is stopped never leaves its weights
    beside the old run's metrics. The set-aside run replaces `out/previous` when the new
    run writes its first checkpoint (`commit_set_aside`), and goes back in place if the new
    run ends before that (`restore_set_aside`, also at the start of the next run there, and
    of `--resume`, where a kill left it aside): a run refused or stopped in its first epoch
    loses nothing. A directory that holds no zoo run but files of the user's (a metrics.json
    of their own among them), a `previous/` that is not a run of this model, and the
    filesystem root are refused, nothing moved. Rank 0 alone moves files (torchrun's other
    processes only read), and none of the processes `zoo train --nproc` starts: it prepared
    the directory (and warned) once before them."""
    if out.resolve() == Path(out.resolve().anchor):
        raise UsageError(f"--out {out}: the filesystem root cannot be a run directory; name a folder for the run")
    restore_set_aside(out)  # an earlier run here that died before its first checkpoint
    owner = run_owner(out)
    if owner is not None and owner != model and not resume:  # --resume names it in its own check
        raise CheckpointError(f"{out} holds a run of {owner}: train {model} into another --out, or delete that "
                              f"directory first")
    files = run_files(out)
    if owner is None:
        check_not_the_users(out, model)
    if resume:
        return
    check_previous(out, model)
    if not _sets_aside():
        return
    if not files["metrics"].is_file():
        if owner == model and files["last"].is_dir():
            log.warning("%s holds an unfinished run of %s: this run starts over (--resume continues it)", out, model)
        return
    pending = out / PENDING
    pending.mkdir()
    for name in RUN_PARTS:
        if files[name].exists():
            files[name].rename(pending / files[name].name)
    log.warning("%s held a finished run of %s: moved to %s (replacing the one there) once this run writes its first "
                "checkpoint, and put back if it ends before", out, model, out / PREVIOUS)


def check_not_the_users(out: Path, model: str) -> None:
    """Refuse `out`, which holds no zoo run, where it holds what a run would not have made:
    a metrics.json (no finished run's: its model/ or last/ would name the model) or files
    and folders of the user's. What runs leave (event files, a trace, staging directories)
    is no user's; model/, last/ and previous/ have their own checks."""
    if not out.is_dir():
        return
    ours = {p.name for p in run_files(out).values()} | {PREVIOUS, PENDING}
    held = sorted(p.name for p in out.iterdir() if p.name not in ours and not STAGING.fullmatch(p.name)
                  and not OLD.fullmatch(p.name) and not p.name.startswith(".zoo-probe-"))
    if run_files(out)["metrics"].is_file():
        raise CheckpointError(f"{out} holds metrics.json but no zoo run (no model/ or last/ naming a model): it is "
                              f"no finished run of {model} to set aside; move it, or train into another --out")
    if held:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise CheckpointError(f"{out} holds {shown} and no zoo run: train into a new or empty directory, or one "
                              f"that holds a run of {model}")


def check_previous(out: Path, model: str) -> None:
    """Refuse a `previous/` in `out` that is not a run of `model` (a folder of the user's):
    setting a finished run aside there would delete it."""
    previous = out / PREVIOUS
    if not previous.exists() or previous.is_dir() and not any(previous.iterdir()):
        return
    if not previous.is_dir() or run_owner(previous) != model:
        raise CheckpointError(f"{previous} is not a run of {model}, and a new run here sets the finished run aside "
                              f"there, replacing what it holds; nothing was moved: move it, or train into another "
                              f"--out")


def _sets_aside() -> bool:
    """Whether this process sets a finished run aside and puts it back: rank 0 alone, and
    none of the processes `zoo train --nproc` starts (it does that itself, around them)."""
    return os.environ.get("RANK", "0") == "0" and not os.environ.get(LAUNCHED)


def commit_set_aside(out: Path) -> None:
    """The finished run set aside for this one becomes `out/previous`: called before the
    new run writes its first checkpoint or resume point. A `previous/` that is no zoo run
    (one made while this run trained) is refused, not deleted."""
    pending = out / PENDING
    if pending.is_dir():
        previous = out / PREVIOUS
        if previous.is_file() or (previous.is_dir() and any(previous.iterdir()) and run_owner(previous) is None):
            raise CheckpointError(f"{previous} is not a zoo run, and the finished run set aside in {pending} would "
                                  f"replace it: move it, and start this run again (the finished run is put back)")
        shutil.rmtree(previous, ignore_errors=True)
        pending.rename(previous)


def restore_set_aside(out: Path) -> bool:
    """The finished run set aside for a run that ended before its first checkpoint, put
    back in `out` (what that run wrote meanwhile, its event files and trace, removed):
    whether there was one."""
    pending = out / PENDING
    if not pending.is_dir() or not _sets_aside():
        return False
    files = run_files(out)
    for name in RUN_PARTS:  # before its first checkpoint, what is here is that run's
        if files[name].is_dir():
            shutil.rmtree(files[name])
        elif files[name].exists():
            files[name].unlink()
        if (pending / files[name].name).exists():
            (pending / files[name].name).rename(files[name])
    shutil.rmtree(pending, ignore_errors=True)
    log.warning("%s: the run ended before its first checkpoint; the finished run it had set aside is back in place",
                out)
    return True


@dataclass
class Run:
    spec: ModelSpec
    out: Path
    options: TrainOptions
    world: World
    seed: int
    epochs: int
    device: str
    show_progress: bool = True
    #: called by the trainer after each epoch with (epoch, scalars): a hook for callers
    on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # what the run settled (batch, val size ...)
    _writer: Any = None
    _resumed: bool = False  # continues a resume point: its first logged step starts a new TensorBoard session

    @property
    def files(self) -> dict[str, Path]:
        return run_files(self.out)

    # -- resume point -----------------------------------------------------------------

    def resume_state(self) -> TrainingState | None:
        """The resume point to continue from (with --resume), checked against this run: its
        config and settings, its thread count, and the selected checkpoint it continues.

        Every trainer calls it once before its first step, resuming or not, so it records the
        thread count the trainer runs on (PPO sets its own) rather than the process's."""
        self.facts["threads_per_process"] = torch.get_num_threads()
        if not self.options.resume:
            return None
        state = load_state(self.files["last"], self.spec.name)
        if state.checkpoint.config != dict(self.spec.config):
            raise CheckpointError(f"resume point {self.files['last']} has config {state.checkpoint.config}, "
                                  f"this run {dict(self.spec.config)}")
        recorded, settings = state.run.get("settings", {}), self._settings()
        for key in RESUME_KEYS:
            if key in recorded and key in settings and recorded[key] != settings[key]:
                raise CheckpointError(f"resume point {self.files['last']} was trained with {key}={recorded[key]}, "
                                      f"this run asks for {settings[key]}; resume with the same settings")
        self._check_threads(recorded)
        self._check_selected(state)
        self._resumed = True
        return state

    def _check_threads(self, recorded: Mapping[str, Any]) -> None:
        """Warn where the resume point was trained on another number of threads: the run
        continues, but not bit for bit (torch splits its sums by thread count). Warned, not
        refused as the settings are: it changes the last bits of a step, not what the run
        trains, and resuming on a machine with other cores is a fair thing to do. The counts
        before are recorded (`threads_before_resume`), so the metrics do not say the last
        process's count was the whole run's."""
        before = list(recorded.get("threads_before_resume") or [])
        was, now = recorded.get("threads_per_process"), self.facts["threads_per_process"]
        if isinstance(was, int) and was != now:
            before.append(was)
            if self.world.main:
                train_log.warning("resume point %s was trained with %d thread%s per process, this run uses %d: it "
                                  "continues the run, but not bit for bit as an uninterrupted run (--threads %d "
                                  "resumes it exactly)", self.files["last"], was, "s" * (was != 1), now, was)
        if before:
            self.facts["threads_before_resume"] = before

    def _check_selected(self, state: TrainingState) -> None:
        """Refuse, before any training, a run whose selected checkpoint (`model/`, the best
        epoch's weights, which the resume point does not hold) is missing or corrupted: it was
        read only at the end, after the resumed epochs had trained, and every --resume after
        failed the same way."""
        best = state.run.get("progress", {}).get("best_epoch")
        if best is None:  # none selected yet: the run writes model/ when it selects one
            return
        model = self.files["model"]
        if (model / META).is_file():
            try:
                load_checkpoint(model, self.spec.name)
                return
            except CheckpointError as exc:
                problem = str(exc)
        else:
            problem = f"the selected checkpoint {model} is missing"
        raise CheckpointError(f"{problem}; it holds the selected weights (epoch {best}) of the run that resume point "
                              f"{self.files['last']} continues, which are not in the resume point, so --resume cannot "
                              f"finish it: put back a good copy of {model}, or train again without --resume")

    def _settings(self) -> dict[str, Any]:
        """How the run trains, as its resume point records it: the settings a resume must
        keep (RESUME_KEYS), and the threads asked for and run on."""
        values = {"clip_grad_norm": self.options.clip_grad_norm, "patience": self.options.patience,
                  "threads": self.options.threads, **self.facts}
        keys = (*RESUME_KEYS, "threads", "threads_per_process", "threads_before_resume")
        return {k: values[k] for k in keys if k in values}

    def save_last(self, state: TrainingState) -> None:
        if self.world.main:
            state.run["settings"] = self._settings()
            commit_set_aside(self.out)
            save_state(self.files["last"], state)

    def save_model(self, checkpoint: Checkpoint) -> None:
        """The selected checkpoint (best validation metric so far), written atomically."""
        if self.world.main:
            commit_set_aside(self.out)
            checkpoint.save(self.files["model"])

    def saved_model(self) -> Checkpoint:
        return load_checkpoint(self.files["model"], self.spec.name)

    def finish(self, checkpoint: Checkpoint) -> Checkpoint:
        """Write the final checkpoint and metrics.json; close the logs."""
        if self.world.main:
            commit_set_aside(self.out)
            checkpoint.save(self.files["model"])
            atomic_write_text(self.files["metrics"], json.dumps(checkpoint.metrics, indent=2))
        self.close()
        return checkpoint

    # -- logs -------------------------------------------------------------------------

    def log(self, step: int, scalars: Mapping[str, float | None]) -> None:
        """Scalars to TensorBoard (`train/loss`, `val/accuracy`, ...), rank 0 only."""
        if not self.world.main or not self.options.tensorboard:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run's first step starts a new session: TensorBoard drops what the
            # stopped process logged from there on, which this run logs again
            self._writer = SummaryWriter(str(self.files["tensorboard"]), purge_step=step if self._resumed else None)
        for name, value in scalars.items():
            if value is not None and math.isfinite(value):
                self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    @contextlib.contextmanager
    def progress(self, total: int, description: str | None = None) -> Iterator[Callable[..., None]]:
        """A progress bar (rank 0) on stderr, where a command's progress goes: on stdout it was
        among the results a script reads (`zoo train ... > log`). Whether to draw one is the
        caller's (`zoo train` draws it on a terminal only: in a log it is a line before an
        error's one line). Under `zoo train --nproc`'s torchrun the processes' stderr is a pipe
        the launcher reads: rank 0 draws on stdout, which it shares with the launcher, where
        the launcher's stderr is a terminal (`PROGRESS_ON_STDOUT`). Yields
        `update(advance=1, status="...")`."""
        console = Console() if os.environ.get(PROGRESS_ON_STDOUT) else Console(stderr=True)
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                      TimeElapsedColumn(), disable=not (self.show_progress and self.world.main),
                      transient=False, console=console) as bar:
            task = bar.add_task(description or f"train {self.spec.name}", total=total, status="")

            def update(advance: int = 1, status: str | None = None) -> None:
                bar.update(task, advance=advance, **({"status": status} if status is not None else {}))

            yield update

    @contextlib.contextmanager
    def profiler(self) -> Iterator[Callable[[], None]]:
        """With --profile: a torch.profiler trace of steps 2-4 in Chrome trace format.
        Yields the per-step callback (a no-op without --profile). Rank 0 writes it."""
        if not self.options.profile:
            yield lambda: None
            return
        from torch.profiler import ProfilerActivity, profile, schedule

        path = self.files["trace"]
        written: list[Path] = []

        def ready(prof) -> None:
            if self.world.main:
                path.parent.mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(str(path))
                written.append(path)

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.startswith("cuda") else [])
        steps = [0]
        with profile(activities=activities, on_trace_ready=ready,
                     schedule=schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=PROFILE_ACTIVE, repeat=1)) as p:

            def step() -> None:
                steps[0] += 1
                p.step()

            yield step
        if written and steps[0] < PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE:
            log.warning("--profile: the run took %d optimizer steps, fewer than the %d the trace is meant to cover",
                        steps[0], PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE)
        if written:
            log.info("profiler trace: %s (open in chrome://tracing or Perfetto)", path)


class Throughput:
    """Samples per second over the timed parts of a run (validation excluded), from the
    figures of its earlier processes where it resumed (a resumed run's own were its last
    process's alone, and a finished run resumed said None)."""

    def __init__(self, samples: int = 0, seconds: float = 0.0) -> None:
        self.samples = int(samples)
        self.seconds = float(seconds)
        self._start: float | None = None

    def start(self) -> None:
        self._start = time.perf_counter()

    def stop(self, samples: int) -> float:
        assert self._start is not None
        elapsed = time.perf_counter() - self._start
        self.samples += samples
        self.seconds += elapsed
        return samples / elapsed if elapsed > 0 else float("nan")

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")
