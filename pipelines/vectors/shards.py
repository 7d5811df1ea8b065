"""labse-embed's pure logic (no Beam): which sentences it embeds, where each goes, and one shard's
files written.

OUTPUT/LANG/ is a `vectors:DIR` folder (`pipelines.embed.saved_vectors`) of one language: shards
`LANG-SSSSS-of-NNNNN.npy` (float32 or float16 rows), `.txt` (line i = the sentence of row i) and
`.keys.npy` (the sentence lookup table, `build_keys`). A sentence is its text with runs of
whitespace collapsed to one space (`normalised_key`, labse-mine's own key, so its lookup finds it);
each language's sentences are unique across all its shards, a sentence's shard being the 64-bit
hash it is filed under (`key_hash`) modulo the shard count. The file names carry the language, so
the shards of several languages can sit in one folder (labse-mine's `vectors:DIR` for a pair).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from pipelines.embed.saved_vectors import KEYS_SUFFIX, build_keys, key_hash, normalised_key
from pipelines.io import storage
from pipelines.io.atomic import published_file
from pipelines.io.config_options import UsageError

# lid.176 codes and their region or script variants (zh-TW, pt_BR): safe as a folder name
LANGUAGE = re.compile(r"^[A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8})*$")
# Sentences handed to the embedder at once: it sorts them by length into `batch_size` batches, so a
# larger chunk pads less; the worker holds one chunk's vectors (16 MB at 512 float32 dimensions).
ENCODE_CHUNK = 8_192


def parse_input(value: str) -> tuple[str, str]:
    """`de=PATH` -> ("de", PATH); UsageError (one line) for anything else."""
    lang, sep, path = str(value).partition("=")
    if not sep or not path.strip():
        raise UsageError(f"--input wants LANG=PATH (e.g. de=gs://B/clean/sentences/lang=de), got {value!r}")
    if not LANGUAGE.match(lang):
        raise UsageError(f"--input {value}: {lang!r} is not a language code (lid.176, e.g. de, zh-TW): it names the "
                         "output folder")
    return lang, path


def sentence_key(text) -> str | None:
    """The sentence labse-embed embeds and files for `text` (labse-mine's key), None when empty."""
    if not isinstance(text, str):
        return None
    key = normalised_key(text)
    return key or None


def shard_count(sentences: int, per_shard: int) -> int:
    """ceil(sentences / per_shard), at least 1 (a language without sentences still gets its folder)."""
    return max(1, math.ceil(sentences / per_shard))


def shard_of(key: str, shards: int) -> int:
    return key_hash(key) % shards


def shard_name(lang: str, shard: int, shards: int) -> str:
    return f"{lang}-{shard:05d}-of-{shards:05d}"


def language_folder(output: str, lang: str) -> str:
    return storage.join(storage.strip(output), lang)


def write_shard(texts: Sequence[str], encode: Callable[[list[str]], np.ndarray], dim: int, folder: str, name: str,
                *, dtype: str = "float32", advance: Callable[[int], None] = lambda n: None) -> dict:
    """`folder/NAME.npy`, `NAME.txt` and `NAME.keys.npy` for `texts` (unique sentence keys), local or
    gs://, each file written whole or not at all (`published_file`). Rows are embedded
    `ENCODE_CHUNK` sentences at a time and spooled to the file, so the worker holds one chunk's
    vectors; `advance(n)` after each chunk. Returns {rows, non_finite, bytes}: rows that hold NaN or
    inf are written as they are (labse-mine drops such a sentence by its counted reason) and counted."""
    item = np.dtype("<f2" if dtype == "float16" else "<f4")
    non_finite = 0
    base = storage.join(folder, name)
    with published_file(base + ".npy") as matrix_tmp, published_file(base + ".txt") as texts_tmp, \
            published_file(base + KEYS_SUFFIX) as keys_tmp:
        with open(matrix_tmp, "wb") as matrix, open(texts_tmp, "wb") as lines:
            np.lib.format.write_array_header_1_0(matrix, {"descr": item.str, "fortran_order": False,
                                                          "shape": (len(texts), dim)})
            for start in range(0, len(texts), ENCODE_CHUNK):
                chunk = list(texts[start:start + ENCODE_CHUNK])
                vectors = np.asarray(encode(chunk), dtype=np.float32)
                if vectors.shape != (len(chunk), dim):
                    raise ValueError(f"the embedder returned {vectors.shape} for {len(chunk)} sentences of "
                                     f"{dim} dimensions")
                non_finite += int((~np.isfinite(vectors).all(axis=1)).sum())
                matrix.write(vectors.astype(item).tobytes())
                lines.write("".join(text + "\n" for text in chunk).encode("utf-8"))
                advance(len(chunk))
        with open(keys_tmp, "wb") as keys:
            np.save(keys, build_keys(Path(texts_tmp)), allow_pickle=False)
    return {"rows": len(texts), "non_finite": non_finite, "bytes": len(texts) * dim * item.itemsize}


def embed_stats(tally: dict, langs: Sequence[str], output: str) -> dict:
    """stats.json's books from the run's tally, whose sentence counts are per language
    (`LANG.read`, `LANG.dropped.REASON`, `LANG.kept`, `LANG.shards`, `LANG.non_finite`, `LANG.bytes`):
    the accounting of every language, of all `sentences` together and of the `input_files`, and a
    `languages` section (unique sentences, shards, folder, bytes, rows that are not finite)."""
    from pipelines.accounting import accounting_section

    langs = sorted(set(langs))
    totals = dict(tally)
    for lang in langs:
        for key, value in tally.items():
            if key.startswith(lang + "."):
                name = "sentences." + key[len(lang) + 1:]
                totals[name] = totals.get(name, 0) + value
    stats = accounting_section(totals, ["sentences", "input_files", *langs])
    stats["languages"] = {lang: {"sentences": tally.get(f"{lang}.kept", 0), "shards": tally.get(f"{lang}.shards", 0),
                                 "folder": language_folder(output, lang), "bytes": tally.get(f"{lang}.bytes", 0),
                                 "non_finite_rows": tally.get(f"{lang}.non_finite", 0)} for lang in langs}
    stats["counts"] = dict(sorted(tally.items()))
    return stats
