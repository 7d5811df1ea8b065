"""The demo's mining step: labse-mine and labse-score together on Multi30k (`make demo`).

It runs two stages' commands, so it sits here with the demo's other orchestration rather than in
either stage (a stage never imports another stage's CLI); recipes/remine.py reuses its helpers."""
from __future__ import annotations

import gzip
import itertools
import os
import random
import time
from pathlib import Path
from typing import Sequence

from pipelines.io.completion import finish_output, read_output_stats
from pipelines.io.overlap import fresh_output
from pipelines.mine.cli import main as mine_main
from pipelines.embed.choice import choose_embedder
from pipelines.embed.embedders import USEM3
from pipelines.score import cli as score_cli


# -------------------------------------------------------------------------------- demo
def _write_lines(path: Path, lines: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def check_exit(command: str, code: int) -> None:
    if code != 0:
        raise RuntimeError(f"{command} failed with exit code {code}")


# usem3 embeds ~20 times faster than e5-small, so the pairs auto gives to e5-small (cs-en here) get a
# smaller sample: their mining set and the training slice of their scorer (which needs >= ~520 rows
# left over for its calibration pools, hence 800 rows with 240 fitted).
DEMO_LANGS = ("de", "fr", "cs")
E5_VAL_LINES = 240
E5_TRAIN_LINES, E5_SCORER_PAIRS = 800, 240


def train_demo_scorers(data: Path, demo: Path, choices: dict) -> tuple[dict, list[str]]:
    """One scorer per embedder that `auto` picked (a scorer learns one embedder's scores), trained
    on Multi30k train for that embedder's languages; {embedder: scorer_dir} and the report lines."""
    train = data / "multi30k" / "train"
    scorers, lines = {}, []
    for embedder in dict.fromkeys(choice.embedder for choice in choices.values()):
        langs = [lang for lang, choice in choices.items() if choice.embedder == embedder]
        paths, max_pairs = {lang: f"{train}.{lang}.gz" for lang in (*DEMO_LANGS, "en")}, 1500
        if embedder != USEM3:  # a slow embedder: a slice of train
            paths = {lang: str(demo / "input" / f"train-slice.{lang}.txt") for lang in paths}
            for lang, path in paths.items():
                _write_lines(Path(path), _read_gz(Path(f"{train}.{lang}.gz"), E5_TRAIN_LINES))
            max_pairs = E5_SCORER_PAIRS
        argv = [arg for lang in langs for arg in ("--positives", f"{lang}:{paths[lang]},en:{paths['en']}")]
        if len(langs) == 1:  # wrong-language negatives: another language's translation of the same lines
            other = next(lang for lang in DEMO_LANGS if lang not in langs)
            argv += ["--other-language", f"{other}:{paths[other]}"]
        scorer_dir = demo / f"scorer-{embedder}"
        started = time.perf_counter()
        check_exit("labse-score train", score_cli.main(
            ["train", *argv, "--embedder", embedder, "--max-pairs", str(max_pairs), "--output", str(scorer_dir)]))
        lines.append(f"{embedder} scorer trained on {len(langs)}x{max_pairs} Multi30k train rows "
                     f"({', '.join(f'{lang}-en' for lang in langs)}) in {time.perf_counter() - started:.0f} s")
        scorers[embedder] = scorer_dir
    return scorers, lines


def combine_scored(scored_dirs: Sequence[Path], combined: Path, stage: str) -> Path:
    """One complete stage output holding every scored directory's shards (hard links where the file
    system has them), named by directory, with each directory's stats: what labse-tfrecords --pairs reads."""
    import shutil

    with fresh_output(combined, overwrite=True):
        for scored_dir in scored_dirs:
            for shard in sorted(scored_dir.glob("*.parquet")):
                try:
                    os.link(shard, combined / f"{scored_dir.name}-{shard.name}")
                except OSError:  # file systems without hard links
                    shutil.copyfile(shard, combined / f"{scored_dir.name}-{shard.name}")
        finish_output(combined, {d.name: read_output_stats(d) for d in scored_dirs}, stage=stage, shards_in_root=True)
    return combined


def read_rows(directory: Path) -> list[dict]:
    """Every row of a stage output's Parquet shards."""
    import pyarrow.parquet as pq

    return [row for shard in sorted(directory.glob("*.parquet")) for row in pq.read_table(shard).to_pylist()]


def _read_gz(path: Path, limit: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, limit)]


def mining_step(data: Path, out: Path, artifacts: dict) -> list[str]:
    """Mine de-en, fr-en and cs-en from Multi30k `val` with `--embedder auto` (usem3 for de and fr,
    e5-small for Czech, which usem3 lacks; each side shuffled separately, as monolingual text, with a
    quarter of each side's partners removed so that some sentences have no translation), score the
    pairs with a scorer per embedder trained on a slice of Multi30k `train`, and report the kept
    pairs' precision against the known alignment. Sets artifacts["scored_pairs"]."""
    demo = out / "mining"
    choices = {lang: choose_embedder(lang, "en") for lang in DEMO_LANGS}
    english = _read_gz(data / "multi30k" / "val.en.gz")
    scorers, lines = train_demo_scorers(data, demo, choices)
    scored_dirs = []
    for lang in DEMO_LANGS:
        embedder = choices[lang].embedder
        foreign = _read_gz(data / "multi30k" / f"val.{lang}.gz", None if embedder == USEM3 else E5_VAL_LINES)
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
        check_exit("labse-mine", mine_main(["--src", str(demo / "input" / lang), "--tgt", str(demo / "input" / f"en-for-{lang}"),
                                       "--src-lang", lang, "--tgt-lang", "en", "--embedder", "auto",
                                       "--output", str(pairs_dir), "--overwrite"]))
        mined_s = time.perf_counter() - started
        check_exit("labse-score", score_cli.main(["--pairs", str(pairs_dir), "--output", str(scored_dir),
                                                  "--model", str(scorers[embedder]), "--keep-precision", "0.8",
                                                  "--overwrite"]))
        mined, kept = read_rows(pairs_dir), read_rows(scored_dir)
        mined_ok = sum(truth.get(r["src"]) == r["tgt"] for r in mined)
        kept_ok = sum(truth.get(r["src"]) == r["tgt"] for r in kept)
        lines.append(
            f"{lang}-en ({embedder}, auto): {len(src_order)} x {len(tgt_order)} shuffled val sentences "
            f"({len(truth)} true pairs) mined in {mined_s:.0f} s -> {len(mined)} pairs "
            f"({mined_ok / max(len(mined), 1):.1%} correct); scorer kept {len(kept)}: "
            f"precision {kept_ok / max(len(kept), 1):.1%}, recall {kept_ok / max(len(truth), 1):.1%}")
        scored_dirs.append(scored_dir)
    # one directory of scored shards for labse-tfrecords: both language pairs side by side
    combined = combine_scored(scored_dirs, demo / "scored_all", stage="demo: labse-score outputs side by side")
    artifacts["scored_pairs"] = str(combined)
    lines.append(f"scored pairs for TFRecords: {combined}")
    return lines
