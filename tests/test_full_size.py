"""The full-size encoder runs: `--config base` with a 501,153-token vocabulary (LaBSE's size), one
labse-train step with gradient caching, one labse-pretrain step, labse-export, each in its own
process whose peak RSS (VmHWM) is checked against the figure documented in BENCHMARKS.md
("Full-size smoke test").

The vocabulary is the project's learner output on real text (Multi30k train + UDHR, 8,000 tokens)
padded with synthetic tokens to 501,153: the embedding matrix, its gradient and its AdamW moments
have the full size, while the shards are tokenised with real tokens only.
"""
import gzip
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from model_helpers import read_multi30k, udhr_lines, write_shards

VOCAB_SIZE = 501_153
PAIRS = 32  # one training step: 2 chunks of 16 per side with --grad-cache-chunk 16
# Peak RSS in GB (kB / 1e6) of each process, measured by this test (BENCHMARKS.md, "Full-size
# smoke test"; the issue's record: 11.9 GB for labse-train with 64 pairs), and the margin allowed
# above it (allocator and thread-pool noise).
DOCUMENTED_PEAK_GB = {"train": 11.2, "pretrain": 11.4, "export": 4.4}
MARGIN = 1.10
# base: 12 layers of 768 (85M parameters) + 501,153 x 768 token embeddings (385M)
MIN_PARAMETERS = 460_000_000

RUNNER = r"""
import importlib, json, sys
module, out = sys.argv[1], sys.argv[2]
code = importlib.import_module(module).main(sys.argv[3:])
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
json.dump({"code": code, "peak_gb": peak_kb / 1e6}, open(out, "w"))
"""


# Wall-clock limits, there to turn a hang into a failure, not to time anything. This is CPU-bound work
# whose wall time grows with the machine's load: on the shared 2-core machine at load average 20 the
# training step took 200 s, the pre-training step 88 s and the whole test 558-617 s (BENCHMARKS.md),
# and the suite's 900 s per test (pytest.ini) was once exceeded at a higher load. The work cannot
# shrink without losing what the test measures (a full-size embedding, its gradient and AdamW moments,
# one real step each), so the limits are sized to load instead: each of the three commands gets 5 times
# the slowest step measured, and the test adds 3 times what the rest took (vocabulary, shards, about
# 300 s), so it fails only at several times that load or on a hang, and then names the command.
STEP_TIMEOUT_S = 1000
TEST_TIMEOUT_S = 3 * STEP_TIMEOUT_S + 900


def run_measured(module: str, args: list[str], out: Path) -> dict:
    """`module.main(args)` in a child process -> {"code", "peak_gb"} of that process alone."""
    result_file = out.with_suffix(".peak.json")
    try:
        subprocess.run([sys.executable, "-c", RUNNER, module, str(result_file), *args], check=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{module} did not finish within {STEP_TIMEOUT_S} s (a hang, or a machine far more loaded "
                    "than the measured load average of 20)", pytrace=False)
    return json.loads(result_file.read_text())


def full_size_vocab(root: Path, out: Path) -> Path:
    """The project's learner on Multi30k train (en/de/fr/cs) + UDHR, padded to VOCAB_SIZE."""
    from vocab.learn import LearnerConfig, learn_from_counts, write_vocab
    from pipelines.text.pretokenize import pretokenize

    counts: Counter = Counter()
    for lang in ("en", "de", "fr", "cs"):
        for line in read_multi30k(root, "train", lang, 3000):
            counts.update(pretokenize(line))
    for name in ("deu", "eng", "fra", "ces"):
        for line in udhr_lines(root, name):
            counts.update(pretokenize(line))
    learned = learn_from_counts(counts, LearnerConfig(vocab_size=8000, char_min_count=1, progress=False)).vocab
    known = set(learned)
    padding = (f"##zz{i:06d}" for i in range(VOCAB_SIZE))
    tokens = learned + [token for token in padding if token not in known][: VOCAB_SIZE - len(learned)]
    out.mkdir(parents=True, exist_ok=True)
    write_vocab(tokens, str(out / "vocab.txt"))
    return out / "vocab.txt"


@pytest.mark.slow
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_base_encoder_with_a_full_size_vocabulary_trains_pretrains_and_exports(labse_data, tmp_path):
    from safetensors import safe_open

    vocab = full_size_vocab(labse_data, tmp_path / "vocab")
    assert len(vocab.read_text(encoding="utf-8").splitlines()) == VOCAB_SIZE
    shards = write_shards(labse_data, vocab, tmp_path / "shards", pairs_per_lang=PAIRS, num_shards=1, max_seq_length=64)

    run = tmp_path / "run"
    train = run_measured("labse_model.train", [
        "--data", shards, "--vocab", str(vocab), "--output", str(run), "--config", "base", "--device", "cpu",
        "--global-batch-size", str(PAIRS), "--grad-cache-chunk", "16", "--max-steps", "1", "--warmup-steps", "0",
        "--log-every", "1", "--save-every", "1", "--max-seq-length", "64",
    ], tmp_path / "train")
    assert train["code"] == 0
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["finished"] and summary["grad_cache_chunk"] == 16
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["num_layers"] == 12 and config["model"]["hidden_size"] == 768
    assert config["model"]["vocab_size"] == VOCAB_SIZE

    mono = tmp_path / "mono" / "en.txt"
    mono.parent.mkdir()
    with gzip.open(labse_data / "multi30k" / "train.en.gz", "rt", encoding="utf-8") as handle:
        lines = [next(handle).strip() for _ in range(400)]
    mono.write_text("".join(line + ("\n\n" if i % 10 == 9 else "\n") for i, line in enumerate(lines)), encoding="utf-8")
    pretrain_dir = tmp_path / "pretrain"
    pretrain = run_measured("labse_model.pretrain", [
        "--mono", f"en:{mono}", "--vocab", str(vocab), "--output", str(pretrain_dir), "--config", "base",
        "--device", "cpu", "--stage-layers", "12", "--stage-fractions", "1", "--max-steps", "1",
        "--warmup-steps", "0", "--global-batch-size", "8", "--max-seq-length", "128", "--log-every", "1",
        "--save-every", "1", "--heldout-rate", "0.05",
    ], tmp_path / "pretrain")
    assert pretrain["code"] == 0
    with safe_open(str(pretrain_dir / "encoder.safetensors"), "pt") as weights:
        shapes = {name: weights.get_slice(name).get_shape() for name in weights.keys()}
    assert [VOCAB_SIZE, 768] in [list(s) for s in shapes.values()]  # the full embedding was trained
    shutil.rmtree(pretrain_dir)  # 7 GB with its optimiser state; the export reads the training run

    exported = tmp_path / "exported"
    export = run_measured("labse_model.export", ["--run", str(run), "--output", str(exported)], tmp_path / "export")
    assert export["code"] == 0
    assert (exported / "modules.json").is_file()
    assert (exported / "vocab.txt").read_text(encoding="utf-8") == vocab.read_text(encoding="utf-8")
    weight_files = list(exported.glob("**/*.safetensors"))
    assert weight_files
    parameters = 0
    for path in weight_files:
        with safe_open(str(path), "pt") as weights:
            for name in weights.keys():
                shape = weights.get_slice(name).get_shape()
                count = 1
                for dim in shape:
                    count *= dim
                parameters += count
    assert parameters >= MIN_PARAMETERS

    peaks = {"train": train["peak_gb"], "pretrain": pretrain["peak_gb"], "export": export["peak_gb"]}
    print("peak RSS (GB):", json.dumps(peaks))
    # weights, gradients and two AdamW moments in float32 must all have been held
    assert peaks["train"] > 4 * 4 * MIN_PARAMETERS / 1e9
    for step, peak in peaks.items():
        assert peak <= DOCUMENTED_PEAK_GB[step] * MARGIN, (
            f"labse-{step} peaked at {peak:.2f} GB, over the documented {DOCUMENTED_PEAK_GB[step]} GB (+10%)")
