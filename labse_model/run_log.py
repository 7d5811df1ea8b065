"""What a training run logs: TensorBoard event files and `RUN_DIR/metrics.jsonl`, resume-safe."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pipelines.io.atomic import write_text_atomic

METRICS_FILE = "metrics.jsonl"


class RunLog:
    """Scalars of one run, written only by the main process (other ranks get a silent log).

    On resume the lines an interrupted run wrote after its last checkpoint are dropped, so
    `metrics.jsonl` reads as if the run had never stopped.
    """

    def __init__(self, run_dir: Path, *, enabled: bool, resumed_at_step: int | None = None):
        self.enabled = enabled
        self.metrics_path = Path(run_dir) / METRICS_FILE
        self._writer = None
        if enabled:
            self._writer = summary_writer(Path(run_dir) / "tensorboard", purge_step=resumed_at_step)
            _truncate_metrics(self.metrics_path, resumed_at_step or 0)

    def record(self, step: int, values: dict[str, float], tensorboard_group: str) -> None:
        """One line `{"step": step, **values}` and TensorBoard scalars `group/name`."""
        if not self.enabled:
            return
        for name, value in values.items():
            self._writer.add_scalar(f"{tensorboard_group}/{name}", value, step)
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, **values}) + "\n")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def summary_writer(log_dir: Path, purge_step: int | None):
    """A TensorBoard writer that does not import TensorFlow.

    TensorBoard's file I/O uses real TensorFlow whenever it is importable (seconds and memory per
    rank: BENCHMARKS.md, section model, "TensorBoard without TensorFlow") unless the module
    `tensorboard.compat.notf` exists; registering that empty marker module selects TensorBoard's
    own pure-Python stub, which writes the same event files.
    """
    import types

    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(log_dir), purge_step=purge_step)


def _truncate_metrics(path: Path, keep_through_step: int) -> None:
    """Drop log lines past the resumed step (written by the interrupted run after its checkpoint)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line)["step"] <= keep_through_step]
    write_text_atomic(path, "".join(line + "\n" for line in kept))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
