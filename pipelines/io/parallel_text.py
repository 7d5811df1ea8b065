"""Parallel text named on a command line: `SRC_LANG:PATH,TGT_LANG:PATH`, the one syntax.

    spec = parse_parallel_text("de:train.de.gz,en:train.en.gz")   # ParallelTextSpec("de", "train.de.gz", "en", ...)

Two line-aligned text files (plain or gzip, local or on a Beam file system such as `gs://`), line i
of one the translation of line i of the other, each with its language. `labse-tfrecords
--parallel-text`, `labse-train --dev-data` and `labse-score train --positives` take this form and
parse it here; any other option that names parallel text should too (`parse_parallel_text(text, option="--my-option")` names the
option in its errors).

No Beam, TensorFlow or torch import: the trainer parses its `--dev-data` with it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipelines.io.config_options import UsageError

# A language code as the pipeline writes them (lid.176's `de`, `und`; also `pt-BR`, `zh_Hant`):
# letters first, no path characters, so `data/x.de:data/x.en` cannot pass as a language and a path.
_LANG = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class ParallelTextSpec:
    """Two line-aligned text files and their languages (`parse_parallel_text` reads the option form)."""

    src_lang: str
    src_path: str
    tgt_lang: str
    tgt_path: str

    @classmethod
    def parse(cls, spec: str, option: str = "--parallel-text") -> "ParallelTextSpec":
        """`parse_parallel_text(spec, option)`."""
        return parse_parallel_text(spec, option)

    def __str__(self) -> str:
        return f"{self.src_lang}:{self.src_path},{self.tgt_lang}:{self.tgt_path}"


def is_parallel_text(spec: str) -> bool:
    """Whether `spec` has the `SRC_LANG:PATH,TGT_LANG:PATH` shape (two comma-separated parts, each
    with a colon); `parse_parallel_text` then checks the parts."""
    parts = spec.split(",")
    return len(parts) == 2 and all(":" in part for part in parts)


def parse_parallel_text(spec: str, option: str = "--parallel-text") -> ParallelTextSpec:
    """`SRC_LANG:PATH,TGT_LANG:PATH` -> ParallelTextSpec; UsageError naming `option` otherwise.

    Each part splits at its first colon, so a path may hold colons (`de:gs://bucket/train.de.gz`)
    but no comma. Spaces around the parts are dropped. The files are not opened here.
    """
    usage = f"{option} expects 'src_lang:path,tgt_lang:path' (e.g. de:train.de.gz,en:train.en.gz), got {spec!r}"
    if not is_parallel_text(spec):
        raise UsageError(usage)
    (src_lang, src_path), (tgt_lang, tgt_path) = ((s.strip() for s in part.split(":", 1)) for part in spec.split(","))
    for lang, path in ((src_lang, src_path), (tgt_lang, tgt_path)):
        if not _LANG.fullmatch(lang):
            raise UsageError(f"{usage}: {lang!r} is not a language code")
        if not path:
            raise UsageError(f"{usage}: no path after {lang}:")
    return ParallelTextSpec(src_lang, src_path, tgt_lang, tgt_path)
