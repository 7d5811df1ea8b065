"""vocab.prune and vocab.count.PruneWords: what reaches the learner is bounded, by counted reasons."""
import ast
import random
from collections import Counter

import apache_beam as beam

from pipelines.accounting import build_accounting, accounting_violations
from tests.conftest import require_file
from vocab.count import UNITS, PruneWords, count_batch
from vocab.prune import fold_pruned_characters, keep_top, language_budgets, word_characters
from vocab.smoothing import smoothed_shares


def test_budgets_follow_smoothed_shares_and_sum_to_max_words():
    sizes = {"en": (1_000_000, 50_000), "de": (100_000, 20_000), "sw": (1_000, 30_000)}
    budgets = language_budgets(sizes, 0.3, 10_000)
    shares = smoothed_shares({lang: size[0] for lang, size in sizes.items()}, 0.3)
    assert sum(budgets.values()) <= 10_000 and sum(budgets.values()) >= 10_000 - len(sizes)
    for lang in sizes:
        assert abs(budgets[lang] - 10_000 * shares[lang]) <= 1
    # smoothing at work: the language with 1,000x less text keeps far more than 1/1000 of it
    assert budgets["sw"] > budgets["en"] / 10


def test_budgets_give_a_small_language_all_its_words_and_the_rest_to_the_others():
    sizes = {"en": (1_000_000, 50_000), "de": (100_000, 20_000), "tiny": (1_000, 10)}
    budgets = language_budgets(sizes, 0.3, 10_000)
    assert budgets["tiny"] == 10
    assert budgets["en"] + budgets["de"] >= 10_000 - 10 - 2
    assert language_budgets(sizes, 0.3, 0) == {"en": 50_000, "de": 20_000, "tiny": 10}  # 0: no limit
    assert language_budgets(sizes, 0.3, 10**9) == {"en": 50_000, "de": 20_000, "tiny": 10}  # small corpus


def test_keep_top_breaks_ties_by_the_word_whatever_the_order():
    entries = [(5, "b"), (9, "z"), (5, "a"), (5, "c"), (1, "aa")]
    for seed in range(5):
        random.Random(seed).shuffle(entries)
        assert keep_top(entries, 3) == [(9, "z"), (5, "a"), (5, "b")]
    assert keep_top(entries, 0) == []


def _characters(entries) -> Counter:
    total = Counter()
    for entry in entries:
        total.update(word_characters(entry))
    return total


def test_folding_keeps_the_character_counts_of_the_pruned_words():
    entries = [(9, "ab"), (7, "a"), (5, "xyx"), (2, "bz")]
    kept = keep_top(entries, 2)
    written = fold_pruned_characters(kept, _characters(entries))
    assert _characters(written) == _characters(entries)  # the learner sees the unpruned counts
    # x: 2 x 5 (twice in "xyx"), y: 5, z: 2, b: 2 (from "bz"), added to the kept word "a" none
    assert written == [(10, "x"), (9, "ab"), (7, "a"), (5, "y"), (2, "b"), (2, "z")]
    assert fold_pruned_characters(entries, _characters(entries)) == keep_top(entries, 4)  # nothing pruned
    # a kept one-character word takes its character's pruned count
    assert fold_pruned_characters([(3, "q")], {"q": 5}) == [(5, "q")]


def _collect(out, folder):
    """Runs the pipeline of `out` ({"counts", "tally"}) -> (kept counts, summed tally)."""
    for name in ("counts", "tally"):
        out[name] | f"Repr[{name}]" >> beam.Map(repr) | f"Write[{name}]" >> beam.io.WriteToText(f"{folder}/{name}")
    out["counts"].pipeline.run().wait_until_finish()

    def read(name):
        return [ast.literal_eval(line) for path in sorted(folder.glob(f"{name}-*"))
                for line in path.read_text(encoding="utf-8").splitlines()]

    return read("counts"), sum((Counter(t) for t in read("tally")), Counter())


def _run_prune(counts, max_words, folder, smoothing=0.3):
    pipeline = beam.Pipeline()
    return _collect(pipeline | beam.Create(counts) | PruneWords(max_words, smoothing), folder)


def test_prune_words_keeps_each_languages_top_words_with_ties_cut_by_the_word(tmp_path):
    # en: 40 words, the last 12 tied at 10; de: 15 words; equal occurrences -> equal shares
    en = {f"w{i:02d}": 100 - i for i in range(20)} | {f"t{i}": 50 for i in range(8, 0, -1)} | \
         {f"r{i:02d}": 10 for i in range(12)}
    de = {f"d{i:02d}": 3 for i in range(15)}
    de["d14"] += sum(en.values()) - sum(de.values())  # same total occurrences as en
    counts = [((lang, word), n) for lang, table in (("en", en), ("de", de)) for word, n in table.items()]
    random.Random(0).shuffle(counts)
    kept, tally = _run_prune(counts, 48, tmp_path)
    budgets = language_budgets({"en": (sum(en.values()), len(en)), "de": (sum(de.values()), len(de))}, 0.3, 48)
    assert budgets == {"en": 33, "de": 15}  # de keeps all its 15 words, en gets the rest of 2 x 24
    expected_en = sorted(en, key=lambda w: (-en[w], w))[:33]
    # the cut falls inside the tied r-words: the first ones by the word are kept
    assert [w for w in expected_en if w.startswith("r")] == [f"r{i:02d}" for i in range(5)]
    kept_en = [(en[w], w) for w in expected_en]
    folded_en = fold_pruned_characters(kept_en, _characters((n, w) for w, n in en.items()))
    assert {"5", "6", "r"} <= {w for _, w in folded_en} - set(expected_en)  # r05..r11's characters
    assert sorted(kept) == sorted([(("en", w), n) for n, w in folded_en] + [(("de", w), n) for w, n in de.items()])
    assert tally["word_types.read"] == 55 and tally["word_types.kept"] == 48
    assert tally["word_types.dropped.over_language_budget"] == 7 == tally["pruned_types.en"]
    assert tally["pruned_words.en"] == 7 * 10 and "pruned_types.de" not in tally
    assert not accounting_violations(build_accounting(tally, ["word_types"]))


def test_prune_words_zero_keeps_everything_and_still_accounts(tmp_path):
    counts = [(("en", "a"), 3), (("en", "b"), 1), (("fr", "a"), 2)]
    kept, tally = _run_prune(counts, 0, tmp_path)
    assert sorted(kept) == sorted(counts)
    assert tally == {"word_types.read": 3, "word_types.kept": 3}


def test_counting_step_prunes_real_text_per_language(labse_data, tmp_path):
    """UDHR in three scripts through CountWords: per language the kept words are exactly its most
    frequent (ties by the word), and the tally balances for every unit."""
    from vocab.count import CountWords

    rows = []
    for lang, name in (("ru", "rus"), ("zh", "cmn_hans"), ("de", "deu")):
        text = require_file(labse_data, f"udhr/{name}.txt").read_text(encoding="utf-8")
        rows += [(lang, line) for line in text.splitlines() if line.strip()]
    full, _, _ = count_batch(rows, holdout_rate=0.0)
    pipeline = beam.Pipeline()
    kept, tally = _collect(pipeline | beam.Create(rows) | CountWords(holdout_rate=0.0, max_words=600), tmp_path)
    assert not accounting_violations(build_accounting(tally, UNITS))
    sizes = {}
    for (lang, _), n in full.items():
        occurrences, distinct = sizes.get(lang, (0, 0))
        sizes[lang] = (occurrences + n, distinct + 1)
    budgets = language_budgets(sizes, 0.3, 600)
    assert sum(budgets.values()) <= 600
    assert len(kept) == sum(budgets.values()) + tally["folded_character_entries"]
    for lang, budget in budgets.items():
        ranked = sorted(((n, w) for (l, w), n in full.items() if l == lang), key=lambda e: (-e[0], e[1]))
        written = sorted((n, w) for (l, w), n in kept if l == lang)
        assert written == sorted(fold_pruned_characters(ranked[:budget], _characters(ranked)))
        assert _characters(written) == _characters(ranked)
        assert tally.get(f"pruned_types.{lang}", 0) == len(ranked) - budget
        assert tally.get(f"pruned_words.{lang}", 0) == sum(n for n, _ in ranked[budget:])
    assert tally["word_types.read"] == len(full) > 600 + 1000  # the budget bites


def test_cli_refuses_a_negative_max_words(tmp_path, capsys):
    from vocab.cli import main

    code = main(["--input-text", f"en={tmp_path}/x.txt", "--output", str(tmp_path / "v.txt"), "--max-words", "-1"])
    assert code == 2 and "--max-words must be at least 0" in capsys.readouterr().err
