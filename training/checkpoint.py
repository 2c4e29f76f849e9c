"""Distributed checkpoints (torch.distributed.checkpoint) that resume exactly and never look
complete after a crash.

A save is collective. Every rank writes into `step_N.tmp/` (DCP shards for model and optimizer,
plus `rank_<R>.pt` with its RNG states and the caller's `extra`); after all ranks agree that
they succeeded, rank 0 writes `meta.json` and renames the folder to `step_N` (atomic on one
filesystem). Only folders named `step_N` holding `meta.json` and DCP's `.metadata` count as
complete (the rule lives in `conf.run_dir.checkpoint_dirs`). Works without a process group (one
process).
The checkpoint root must be one filesystem that every rank sees (shared across nodes).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_state_dict)

from conf.run_dir.checkpoint_dirs import (META_FILENAME, checkpoints_beyond_newest,
                                          is_complete_checkpoint, latest_checkpoint,
                                          read_checkpoint_meta, replaced_step_dir, stale_dirs,
                                          step_dir, tmp_step_dir)
from conf.run_dir.disk_space import disk_full_line, is_disk_full
from conf.run_dir.checkpoint_verify import MANIFEST_KEY, checkpoint_problems, describe
from parallel.dims import LAYOUT_DEFAULTS
from training.checkpoint_digests import add_unclaimed_digests, gather_digests, own_digests
from training.durable_files import fsync_path, fsynced_write
from training.rng_state import capture_rng_state, restore_rng_state
from training.safe_dcp import SafeFileSystemReader, SafeLoadPlanner

__all__ = ["CheckpointCorrupt", "CheckpointError", "CheckpointMismatch", "latest_checkpoint", "load_checkpoint",
           "read_checkpoint_meta", "save_checkpoint", "capture_rng_state", "restore_rng_state"]

FORMAT_VERSION = 2  # 2: meta.json lists every file's size and sha256
_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.Tensor, torch.dtype,
                 torch.device, torch.Size)


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded; raised on every rank with the same message."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint was written by a run whose layout does not match this one."""


class CheckpointCorrupt(CheckpointError):
    """A file of the checkpoint is missing, truncated, altered or unsafe; nothing was loaded."""


# --- process group helpers (all no-ops without a process group) --------------------------------

def _is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank_and_world_size() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if _is_distributed() else (0, 1)


@contextmanager
def _single_process_dcp_is_intended():
    """DCP warns on every single-process save/load, even with no_dist=True; here it is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


def _gather_errors(error: str | None, group=None) -> list[str]:
    """Every rank learns every rank's error (also serves as a barrier)."""
    if not _is_distributed():
        return [f"rank 0: {error}"] if error else []
    errors: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    return [f"rank {r}: {e}" for r, e in enumerate(errors) if e]


def _on_every_rank(action, *, what: str, error_type: type[Exception] = CheckpointError,
                   group=None, where: Path | None = None) -> None:
    """Run `action()` on every rank; if any rank fails, raise on every rank (no rank hangs)."""
    error = None
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - re-raised below on every rank
        error = disk_full_line(exc, where) or f"{type(exc).__name__}: {exc}"
    errors = _gather_errors(error, group)
    if errors:
        raise error_type(f"{what} failed: " + "; ".join(errors))


def _run_on_rank0(action, *, what: str, group=None, where: Path | None = None) -> None:
    """Run `action()` on rank 0 only; re-raise its failure on every rank (no rank hangs)."""
    rank, _ = _rank_and_world_size()
    error = None
    if rank == 0:
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - re-raised below on every rank
            error = disk_full_line(exc, where) or f"{type(exc).__name__}: {exc}"
    if _is_distributed():
        box = [error]
        dist.broadcast_object_list(box, src=0, group=group)
        error = box[0]
    if error:
        raise CheckpointError(f"{what} failed on rank 0: {error}")


# --- rank-local state: RNG + caller extras ------------------------------------------------------

def _check_plain(value, *, where: str) -> None:
    """Fail at save time (not at resume) if `value` cannot be loaded with weights_only=True."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, where=f"{where} key {key!r}")
            _check_plain(item, where=f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_plain(item, where=f"{where}[{index}]")
    elif not isinstance(value, _PLAIN_LEAVES):
        raise TypeError(
            f"{where} is a {type(value).__module__}.{type(value).__qualname__}; checkpoint "
            "extras must be plain Python values (int, float, str, list, dict, ...) or tensors"
        )


def _validate_save_inputs(*, extra: dict, metadata: dict, keep_last: int | None) -> None:
    _check_plain(extra, where="extra")
    json.dumps(metadata)
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (or None to keep all), got {keep_last}")


def _rank_file(folder: Path, *, rank: int) -> Path:
    return folder / f"rank_{rank}.pt"


def _write_rank_file(folder: Path, *, rank: int, rng_state: dict, extra: dict) -> None:
    buffer = io.BytesIO()
    torch.save({"rng": rng_state, "extra": extra}, buffer)
    fsynced_write(_rank_file(folder, rank=rank), buffer.getvalue())


def _read_rank_file(folder: Path, *, rank: int) -> dict:
    path = _rank_file(folder, rank=rank)
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: the checkpoint in {folder} is damaged")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch's advice (weights_only=False) is wrong here
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointCorrupt(f"{path} is unreadable or holds more than plain values "
                                f"({type(exc).__name__}: {cause})") from None


# --- folder publishing (rank 0) -----------------------------------------------------------------

def _rename_into_place(source: Path, target: Path) -> None:
    """The single atomic step that makes a checkpoint visible (tests inject crashes here)."""
    os.replace(source, target)
    fsync_path(target.parent)


def _prepare_tmp_dir(root: Path, *, step: int) -> None:
    tmp = tmp_step_dir(root, step=step)
    if tmp.exists():
        shutil.rmtree(tmp)  # a crashed earlier attempt at this very step
    root.mkdir(exist_ok=True)  # never parents: a removed run dir is not recreated
    tmp.mkdir()


def _write_meta(folder: Path, *, meta: dict) -> None:
    fsynced_write(folder / META_FILENAME, json.dumps(meta, indent=2, sort_keys=True).encode())


def _publish(root: Path, *, step: int, meta: dict) -> None:
    """meta.json, then rename `step_N.tmp` -> `step_N` (moving an existing `step_N` aside)."""
    tmp, final = tmp_step_dir(root, step=step), step_dir(root, step=step)
    _write_meta(tmp, meta=meta)
    if final.exists():
        replaced = replaced_step_dir(root, step=step)
        shutil.rmtree(replaced, ignore_errors=True)
        _rename_into_place(final, replaced)
    _rename_into_place(tmp, final)


def _remove_stale_and_old(root: Path, *, keep_last: int | None) -> None:
    for folder in stale_dirs(root):
        shutil.rmtree(folder, ignore_errors=True)
    if keep_last is not None:
        for folder in checkpoints_beyond_newest(root, keep_last=keep_last):
            shutil.rmtree(folder, ignore_errors=True)


# --- public API ---------------------------------------------------------------------------------

FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def _as_lists(model, optimizer) -> tuple[list, list]:
    """One model part per pipeline stage a rank holds (or a single model), one optimizer each."""
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    optimizers = _optimizers(optimizer)
    assert len(models) == len(optimizers), (len(models), len(optimizers))
    return models, optimizers


def _part_state_dicts(model, optimizer) -> list[tuple[dict, dict]]:
    """(model, optimizer) state dicts of each part (one per pipeline stage a rank holds).

    get_state_dict initialises an empty optimizer state with a zero-lr step; callers that must
    not keep that side effect clear `optimizer.state` afterwards.
    """
    return [get_state_dict(part, part_optimizer, options=FLAT)
            for part, part_optimizer in zip(*_as_lists(model, optimizer))]


def _model_and_optimizer_state(parts: list[tuple[dict, dict]]) -> dict:
    """DCP state dict keyed by parameter name, without wrapper prefixes (DDP `module.`, FSDP,
    compile); optimizer state flattened to names too, so parts of a pipeline merge and any
    layout (DTensor shards, other stages) can load what it needs: DCP reshards on load.
    """
    model_state, optim_state = {}, {}
    for part_model, part_optim in parts:
        model_state.update(part_model)
        optim_state.update(part_optim)
    return {"model": model_state, "optimizer": optim_state}


def _set_model_and_optimizer_state(model, optimizer, parts: list[tuple[dict, dict]],
                                   state: dict) -> None:
    """Give each part the keys it had in `parts`, with the values DCP loaded into `state`."""
    models, optimizers = _as_lists(model, optimizer)
    for part, part_optimizer, (own_model, own_optim) in zip(models, optimizers, parts):
        set_state_dict(part, part_optimizer,
                       model_state_dict={k: state["model"][k] for k in own_model},
                       optim_state_dict={k: state["optimizer"][k] for k in own_optim},
                       options=FLAT)


def _optimizers(optimizer) -> list:
    return list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]


def _optimizer_is_empty(optimizer) -> bool:
    return not any(o.state for o in _optimizers(optimizer))


def _clear_optimizer_state(optimizer) -> None:
    for o in _optimizers(optimizer):
        o.state.clear()


@dataclass
class StagedSave:
    """What a save needs once the model may change again: this rank's state (copied to host
    memory when `copy`), its RNG states and extras, and where and how to publish it."""

    root: Path
    step: int
    state: dict
    rng_state: dict
    extra: dict
    meta: dict
    keep_last: int | None

    @property
    def tmp(self) -> Path:
        return tmp_step_dir(self.root, step=self.step)


def save_checkpoint(root: Path, *, step: int, model, optimizer, extra: dict | None = None,
                    metadata: dict | None = None, keep_last: int | None = None) -> Path:
    """Collective: write `root/step_<N>` atomically and return its path.

    `model`/`optimizer`: a module and its optimizer, or lists of them (pipeline stages).

    `extra` is this rank's own state (data position, scheduler, loss scaler ...), restored by
    `load_checkpoint`; plain Python values and tensors only. `metadata` (JSON) goes to meta.json
    (e.g. the parallel layout). `keep_last=k` deletes complete checkpoints older than the newest
    k after this save succeeds; stale `.tmp` folders are always removed then.
    """
    staged = stage_checkpoint(root, step=step, model=model, optimizer=optimizer, extra=extra,
                              metadata=metadata, keep_last=keep_last, copy=False)
    return write_staged(staged)


def stage_checkpoint(root: Path, *, step: int, model, optimizer, extra: dict | None = None,
                     metadata: dict | None = None, keep_last: int | None = None,
                     copy: bool = True, buffers: dict | None = None) -> StagedSave:
    """Collective, the part of a save the step waits for: check the arguments, prepare
    `step_N.tmp`, take the state dicts and (`copy`) copy them to host memory, pinned where
    CUDA exists, so training may go on while `write_staged` writes them. `buffers`: the
    staged state of an earlier save that is no longer being written, reused when its keys
    match (no allocation, no page faults)."""
    root, extra, metadata = Path(root), dict(extra or {}), dict(metadata or {})
    _on_every_rank(lambda: _validate_save_inputs(extra=extra, metadata=metadata,
                                                 keep_last=keep_last),
                   what="checking save_checkpoint arguments", error_type=ValueError)
    rng_state = capture_rng_state()
    optimizer_was_empty = _optimizer_is_empty(optimizer)
    _run_on_rank0(lambda: _prepare_tmp_dir(root, step=step), what="preparing checkpoint folder",
                  where=tmp_step_dir(root, step=step))
    state = _model_and_optimizer_state(_part_state_dicts(model, optimizer))
    if copy:
        state = host_copy(state, into=buffers)
    if optimizer_was_empty:
        _clear_optimizer_state(optimizer)  # undo get_state_dict's zero-lr init: stay exact
    meta = {"format_version": FORMAT_VERSION, "step": step,
            "world_size": _rank_and_world_size()[1],
            "optimizer_state_empty": optimizer_was_empty, "metadata": metadata}
    return StagedSave(root=root, step=step, state=state, rng_state=rng_state, extra=extra,
                      meta=meta, keep_last=keep_last)


def host_copy(state: dict, *, into: dict | None = None) -> dict:
    """A copy of `state` in host memory (pinned where CUDA exists); DTensors stay DTensors.
    `into`: buffers of the same structure to copy into (else new ones)."""
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    same = into is not None and all(into.get(k, {}).keys() == part.keys()
                                    for k, part in state.items())
    copied = into if same else _create_cpu_state_dict(state, pin_memory=torch.cuda.is_available())
    return _copy_state_dict(state, copied)


def write_staged(staged: StagedSave, *, group=None) -> Path:
    """Collective over `group` (default: the world): DCP write, rank files, SHA-256 of every
    file, then rank 0's meta.json and rename. A failure raises on every rank; after a full
    disk rank 0 removes the partial folder at once (never resumed from; its space is freed)."""
    try:
        return _write_and_publish(staged, group=group)
    except CheckpointError as exc:
        if _rank_and_world_size()[0] == 0 and is_disk_full(exc):
            shutil.rmtree(staged.tmp, ignore_errors=True)
        raise


def _write_and_publish(staged: StagedSave, *, group) -> Path:
    rank, _ = _rank_and_world_size()
    tmp, root, step = staged.tmp, staged.root, staged.step

    def write_shards() -> None:
        try:
            with _single_process_dcp_is_intended():
                dcp.save(staged.state, checkpoint_id=tmp, process_group=group,
                         no_dist=not _is_distributed())
        except CheckpointException as exc:  # a BaseException holding each rank's error
            failures = [error for error, _ in exc.failures.values()]
            raise (failures[0] if failures else RuntimeError(str(exc).splitlines()[0])) from None

    _on_every_rank(write_shards, what=f"saving step {step} into {tmp}", group=group,
                   where=tmp)
    digests: dict = {}

    def write_and_hash() -> None:
        _write_rank_file(tmp, rank=rank, rng_state=staged.rng_state, extra=staged.extra)
        digests.update(own_digests(tmp, rank=rank, rank_file=_rank_file(tmp, rank=rank).name))

    _on_every_rank(write_and_hash, what=f"writing rank files into {tmp}", group=group,
                   where=tmp)
    manifest = gather_digests(digests, group)
    meta = {**staged.meta, "saved_unix_s": time.time(), MANIFEST_KEY: manifest}

    def finish() -> None:
        add_unclaimed_digests(tmp, manifest)
        _publish(root, step=step, meta=meta)
        _remove_stale_and_old(root, keep_last=staged.keep_last)

    _run_on_rank0(finish, what=f"publishing checkpoint step {step} in {root}", group=group,
                  where=tmp)
    return step_dir(root, step=step)


def verify_checkpoint(path: Path) -> None:
    """Collective: every rank checks a share of the files against the manifest (and the
    metadata pickle against the allow-list); CheckpointCorrupt on every rank if any failed."""
    rank, world_size = _rank_and_world_size()
    problems = checkpoint_problems(Path(path), share=(rank, world_size))
    if _is_distributed():
        every: list = [None] * world_size
        dist.all_gather_object(every, problems)
        problems = list(dict.fromkeys(p for part in every for p in part))
    if problems:
        raise CheckpointCorrupt(f"damaged checkpoint {describe(path, problems)}")


def _check_layout(path: Path, *, saved: dict, current: dict, allow_reshard: bool) -> bool:
    """True when the checkpoint's layout is this run's (exact resume, per-rank files)."""
    if saved == current:
        return True
    if not allow_reshard:
        differ = ", ".join(f"{k}: saved {saved.get(k)}, now {current.get(k)}"
                           for k in sorted(set(saved) | set(current))
                           if saved.get(k) != current.get(k))
        raise CheckpointMismatch(
            f"checkpoint {path} was saved under another layout ({differ}); a run resumes only "
            "under its own layout. To continue under this layout, start a new run with "
            f"checkpoint.load_from={path} (DCP reshards weights and optimizer state)")
    return False


def load_checkpoint(path: Path, *, model, optimizer, degrees: dict | None = None,
                    allow_reshard: bool = False) -> dict:
    """Collective: restore model, optimizer and this rank's RNG states; return its `extra`.

    `degrees` describes how this run is split ({"world_size": ..., degrees ...}; default: the
    world size). Raises CheckpointMismatch if the checkpoint's layout differs, unless
    `allow_reshard` (then DCP reshards model/optimizer and every rank takes rank 0's file).
    """
    path = Path(path)
    if not is_complete_checkpoint(path):
        raise CheckpointError(
            f"{path} is not a complete checkpoint (needs a step_<N> name, {META_FILENAME} and "
            "DCP's .metadata); use latest_checkpoint(root) to find one"
        )
    meta = read_checkpoint_meta(path)
    rank, world_size = _rank_and_world_size()
    current = dict(degrees or {"world_size": world_size})
    saved = {"world_size": meta["world_size"],
             **{k: meta["metadata"].get("layout", {}).get(k, LAYOUT_DEFAULTS.get(k))
                for k in current if k != "world_size"}}
    same_layout = _check_layout(path, saved=saved, current=current, allow_reshard=allow_reshard)

    verify_checkpoint(path)  # before anything is touched: a caller may fall back to another
    parts = _part_state_dicts(model, optimizer)
    state = _model_and_optimizer_state(parts)
    with _single_process_dcp_is_intended():
        dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner(),
                 no_dist=not _is_distributed())
    _set_model_and_optimizer_state(model, optimizer, parts, state)
    if meta.get("optimizer_state_empty", False):
        _clear_optimizer_state(optimizer)

    rank_state = _read_rank_file(path, rank=rank if same_layout else 0)
    restore_rng_state(rank_state["rng"])
    return rank_state["extra"]
