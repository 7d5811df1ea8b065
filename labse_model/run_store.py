"""Run directories and models on object storage: `--output gs://...`, `--init-from gs://...`,
`labse-export --run/--output gs://...`.

A run directory on object storage is worked in through a local mirror (local then upload):

* At start (rank 0, holding the lock object `URL.lock`), the mirror `$LABSE_CACHE/runs/NAME` is
  emptied and refilled with the run's small files (config, vocab.txt, metrics.jsonl, TensorBoard
  events, summaries) and, for `--resume`, with ONE checkpoint: the newest complete one (or
  `--resume-step`'s). The trainer then runs exactly as on local disk: the local run lock,
  atomic local checkpoints, metrics truncation on resume, summaries.
* After every checkpoint, rank 0 uploads the changed run files, then the checkpoint's files, then
  its marker `checkpoints/step-N/_SUCCESS` LAST: JSON listing every file with its size and sha256.
* A checkpoint counts only with its marker, and a download counts only when every file's sha256
  equals the marker's (then the usual checks run too: the weights' sha256 in the safetensors
  metadata, weights-only torch files). So a checkpoint whose upload was cut off (no marker) or
  whose objects changed since (a digest differs) is never taken as the newest: the next older
  complete one is used, with one warning line.
* Checkpoints after the one a run resumed from (skipped as damaged, or later than --resume-step)
  are set aside at the run's first upload: their marker is renamed `_SET_ASIDE` (files kept for
  inspection), as the local trainer renames them `step-N.superseded`. `keep_checkpoints` prunes
  the bucket as it prunes the disk (marker first).

Limits: one node (all processes of the run on one host: the mirror is that host's disk); the
other ranks wait at their next collective while rank 0 uploads.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Callable, Iterator

from pipelines.io import storage
from pipelines.io.completion import SUCCESS_MARKER
from pipelines.io.locks import output_lock
from labse_model.checkpoint import STEP_DIR, CorruptCheckpointError
from pipelines.io.config_options import UsageError

logger = logging.getLogger("labse_model.run_store")

CHECKPOINTS = "checkpoints"
SET_ASIDE_MARKER = "_SET_ASIDE"
# Files of a run that are rewritten in place by nothing but the trainer; everything else is a
# checkpoint (uploaded with its marker) or a temporary name.
_TEMPORARY = re.compile(r"(^|/)\.|\.tmp-|\.lock$")


class RemoteRunDir:
    """A run directory at `url` mirrored in the local folder `local`."""

    def __init__(self, url: str, local: Path):
        self.url, self.local = url.rstrip("/"), Path(local)
        self._uploaded: dict[str, tuple[int, int]] = {}  # run file -> (size, mtime_ns) last uploaded
        self._to_set_aside: list[int] = []

    @classmethod
    def for_url(cls, url: str) -> "RemoteRunDir":
        return cls(url, storage.cache_dir("runs", storage.url_key(url)))

    # ------------------------------------------------------------------ reading
    def _checkpoint_url(self, step: int, *names: str) -> str:
        return storage.join(self.url, CHECKPOINTS, f"step-{step:08d}", *names)

    def complete_steps(self) -> list[int]:
        """Steps whose checkpoint has its marker, oldest first."""
        pattern = storage.join(self.url, CHECKPOINTS, "step-*", SUCCESS_MARKER)
        steps = []
        for marker in storage.glob(pattern):
            match = STEP_DIR.match(marker.rsplit("/", 2)[-2])
            if match:
                steps.append(int(match.group(1)))
        return sorted(steps)

    def pull(self, *, resume: bool, step: int | None = None) -> Path | None:
        """Empty the mirror, then download the run files and (`resume`) one checkpoint: returns it."""
        names = [n for n in storage.walk(self.url) if not n.startswith(CHECKPOINTS + "/") and not _TEMPORARY.search(n)]
        targets = {n: storage.local_child(self.local, n, source=storage.join(self.url, n)) for n in names}
        if self.local.exists():
            shutil.rmtree(self.local)
        self.local.mkdir(parents=True)
        for name, target in targets.items():
            storage.download(storage.join(self.url, name), target)
            self._remember(name)
        steps = self.complete_steps()
        if not resume:
            if steps:
                raise UsageError(f"{self.url} already holds checkpoints: pass --resume to continue it, or choose "
                                 "a new --output")
            return None
        return self.pull_checkpoint(steps, step)

    def pull_checkpoint(self, steps: list[int], step: int | None) -> Path:
        """Download the checkpoint of `step`, or the newest of `steps` whose files match their marker."""
        if step is not None and step not in steps:
            raise FileNotFoundError(f"no complete checkpoint for step {step} under {self.url}/{CHECKPOINTS}; "
                                    f"complete steps: {steps}")
        candidates = [step] if step is not None else list(reversed(steps))
        if not candidates:
            raise FileNotFoundError(f"no complete checkpoint under {self.url}/{CHECKPOINTS} (none has its "
                                    f"{SUCCESS_MARKER} marker)")
        skipped = []
        for candidate in candidates:
            try:
                path = self._download_checkpoint(candidate)
            except CorruptCheckpointError as exc:
                if step is not None:
                    raise
                skipped.append(f"step {candidate}: {exc}")
                continue
            if skipped:
                logger.warning("skipped %s; using step %d, the newest complete checkpoint on %s",
                               "; ".join(skipped), candidate, self.url)
            self._to_set_aside = [s for s in steps if s > candidate]
            return path
        raise CorruptCheckpointError(f"no checkpoint of {self.url} downloads intact: " + "; ".join(skipped))

    def _download_checkpoint(self, step: int) -> Path:
        marker_url = self._checkpoint_url(step, SUCCESS_MARKER)
        try:
            files = json.loads(storage.read_bytes(marker_url))["files"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpointError(f"{marker_url} is not a checkpoint marker ({exc})") from None
        final = self.local / CHECKPOINTS / f"step-{step:08d}"
        staging = final.with_name(f".tmp-{final.name}")
        if not isinstance(files, dict):
            raise CorruptCheckpointError(f"{marker_url} is not a checkpoint marker (its files are not a mapping)")
        targets = {name: storage.local_child(staging, name, source=f"{marker_url}: file {name!r}") for name in files}
        shutil.rmtree(staging, ignore_errors=True)
        try:
            for name, expected in sorted(files.items()):
                storage.download(self._checkpoint_url(step, name), targets[name])
                if storage.sha256_file(targets[name]) != expected["sha256"]:
                    raise CorruptCheckpointError(f"{self._checkpoint_url(step, name)} does not match the sha256 "
                                                 "its marker records (changed or half-copied)")
        except (CorruptCheckpointError, FileNotFoundError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, FileNotFoundError):
                raise CorruptCheckpointError(f"{final.name}: a file its marker lists is missing ({exc})") from None
            raise
        staging.rename(final)
        return final

    # ------------------------------------------------------------------ writing
    def _remember(self, name: str) -> None:
        stat = (self.local / name).stat()
        self._uploaded[name] = (stat.st_size, stat.st_mtime_ns)

    def publish_files(self) -> None:
        """Upload the run files (not checkpoints) that changed since their last upload."""
        for path in sorted(p for p in self.local.rglob("*") if p.is_file()):
            name = path.relative_to(self.local).as_posix()
            if name.startswith(CHECKPOINTS + "/") or _TEMPORARY.search(name):
                continue
            stat = path.stat()
            if self._uploaded.get(name) != (stat.st_size, stat.st_mtime_ns):
                storage.upload(path, storage.join(self.url, name))
                self._uploaded[name] = (stat.st_size, stat.st_mtime_ns)

    def publish(self, step: int, keep_last: int | None = None) -> None:
        """Upload the run files, then checkpoint `step`'s files, then its marker (last)."""
        for later in self._to_set_aside:
            marker = self._checkpoint_url(later, SUCCESS_MARKER)
            if storage.exists(marker):
                storage.write_bytes(self._checkpoint_url(later, SET_ASIDE_MARKER), storage.read_bytes(marker))
                storage.remove(marker)
                logger.warning("set aside %s (a later checkpoint than the one resumed from; files kept)",
                               self._checkpoint_url(later))
        self._to_set_aside = []
        self.publish_files()
        local = self.local / CHECKPOINTS / f"step-{step:08d}"
        marker = self._checkpoint_url(step, SUCCESS_MARKER)
        if storage.exists(marker):  # rewriting a step: it must not look complete while its files change
            storage.remove(marker)
        files = {}
        for path in sorted(p for p in local.iterdir() if p.is_file()):
            files[path.name] = {"size": path.stat().st_size, "sha256": storage.sha256_file(path)}
            storage.upload(path, self._checkpoint_url(step, path.name))
        storage.write_bytes(marker, (json.dumps({"complete": True, "step": step, "files": files}, indent=2)
                                     + "\n").encode())
        logger.info("uploaded checkpoint %d to %s", step, self._checkpoint_url(step))
        if keep_last:
            for old in self.complete_steps()[:-keep_last]:
                storage.remove(self._checkpoint_url(old, SUCCESS_MARKER))
                storage.remove_tree(self._checkpoint_url(old))


@contextlib.contextmanager
def run_directory(args, ctx) -> Iterator[RemoteRunDir | None]:
    """For the `with` block, `args.output` is a local directory: itself, or the mirror of a URL
    (`RemoteRunDir`, pulled on rank 0 under the lock object; on success uploaded, then removed).
    Sets `args.run_store` (None for a local run)."""
    from labse_model.distributed import barrier

    output = args.output
    args.run_store = None
    if not storage.is_remote(output):
        yield None
        return
    import os

    if ctx.world_size != int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)):
        raise UsageError(f"--output {output}: a run directory on object storage is mirrored on one host; with "
                         "several nodes, give a shared filesystem path")
    store = RemoteRunDir.for_url(output)
    with contextlib.ExitStack() as held:
        def take_and_pull() -> None:
            held.enter_context(output_lock(output))
            store.pull(resume=args.resume, step=args.resume_step)

        _on_every_rank(take_and_pull, ctx)
        barrier()
        args.output, args.run_store = store.local, store
        try:
            yield store
            if ctx.is_main:
                store.publish_files()
                # The bucket holds everything now, and the next start pulls afresh: free the disk.
                shutil.rmtree(store.local, ignore_errors=True)
        finally:
            args.output = output


def _on_every_rank(work: Callable[[], object], ctx) -> None:
    """`work()` on rank 0; its one-line error, if any, raised on every rank (none waits forever)."""
    import torch.distributed as dist

    message = [None]
    if ctx.is_main:
        try:
            work()
        except (UsageError, FileNotFoundError) as exc:
            message[0] = str(exc)
            if not (dist.is_available() and dist.is_initialized()):
                raise
            dist.broadcast_object_list(message, src=0)
            raise
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(message, src=0)
        if message[0] is not None:
            raise UsageError(message[0])


def checkpoint_publisher(args, ctx, keep_last: int | None) -> Callable[[int], None] | None:
    """What the loop calls after each checkpoint (`LoopParts.after_checkpoint`): rank 0 uploads it."""
    store = getattr(args, "run_store", None)
    if store is None or not ctx.is_main:
        return None
    return lambda step: store.publish(step, keep_last or None)


# ------------------------------------------------------------------ models read from object storage
_CHECKPOINT_URL = re.compile(r"^(?P<run>.+)/checkpoints/step-(?P<step>\d{8})(?P<file>/model\.safetensors)?/?$")


def fetch_run(url: str, step: int | None = None) -> tuple[Path, Path]:
    """A local copy of a run on object storage (its files and one complete checkpoint, checked as
    for --resume): (run directory, checkpoint folder). Kept under $LABSE_CACHE/downloads."""
    store = RemoteRunDir(url, _download_dir(url))
    checkpoint = store.pull(resume=True, step=step)
    assert checkpoint is not None
    return store.local, checkpoint


def fetch_model(url: str) -> Path:
    """A local copy of what `--init-from URL` names: a run (newest complete checkpoint), one of its
    checkpoints (folder or model.safetensors), or any model folder (sentence-transformers, Hugging
    Face BERT, labse-pretrain output: every object below the prefix but checkpoints and TensorBoard)."""
    url = url.rstrip("/")
    match = _CHECKPOINT_URL.match(url)
    if match:
        _, checkpoint = fetch_run(match["run"], int(match["step"]))
        return checkpoint / "model.safetensors" if match["file"] else checkpoint
    if storage.isdir(storage.join(url, CHECKPOINTS)) and storage.isfile(storage.join(url, "config.json")) \
            and not storage.isfile(storage.join(url, "pretrain_config.json")):
        return fetch_run(url)[1]
    local = _download_dir(url)
    if storage.isfile(url):
        target = storage.local_child(local, url.rsplit("/", 1)[-1], source=url)
        storage.download(url, target)
        return target
    names = [n for n in storage.walk(url) if not n.startswith((CHECKPOINTS + "/", "tensorboard/"))]
    if not names:
        raise FileNotFoundError(f"--init-from {url} does not exist")
    targets = {n: storage.local_child(local, n, source=storage.join(url, n)) for n in names}
    if local.exists():
        shutil.rmtree(local)
    for name, target in targets.items():
        storage.download(storage.join(url, name), target)
    return local


def _download_dir(url: str) -> Path:
    # One folder per process of a host (torchrun's LOCAL_RANK): every rank reads --init-from at once.
    import os

    return storage.cache_dir("downloads", storage.url_key(url), f"rank{os.environ.get('LOCAL_RANK', '0')}")


def publish_directory(local: Path, url: str, *, overwrite: bool) -> None:
    """Upload a finished local folder to `url`, `_SUCCESS` last, under `URL.lock`; an existing
    output is refused unless `overwrite` (then its marker goes first, then every object)."""
    url = url.rstrip("/")
    with output_lock(url):
        existing = storage.walk(url)
        if existing and not overwrite:
            raise FileExistsError(f"{url} exists and is not empty ({len(existing)} objects; pass --overwrite to "
                                  "replace it)")
        if existing:
            if SUCCESS_MARKER in existing:
                storage.remove(storage.join(url, SUCCESS_MARKER))
            storage.remove_tree(url)
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            storage.upload(path, storage.join(url, path.relative_to(local).as_posix()))
        storage.write_bytes(storage.join(url, SUCCESS_MARKER), b'{"complete": true}\n')
