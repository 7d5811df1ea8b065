"""Small real-data inputs for the trainer tests: a WordPiece vocabulary and TFRecord shards of
Multi30k pairs (de/fr/cs-en), written with the project's own TFRecord writer (contract 8).

The vocabulary is learned with the `tokenizers` WordPiece trainer on a few thousand Multi30k lines:
it is a test fixture (seconds), not the product's vocabulary, which `labse-vocab` builds.
"""
from __future__ import annotations

import gzip
from pathlib import Path

from pipelines.text.wordpiece import hf_tokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LANGS = ("de", "fr", "cs")


def read_multi30k(root: Path, split: str, lang: str, limit: int) -> list[str]:
    path = root / "multi30k" / f"{split}.{lang}.gz"
    if not path.is_file():
        raise FileNotFoundError(f"required data file missing: {path}")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(limit)]


def tatoeba_lines(root: Path, lang: str, limit: int) -> list[str]:
    """The first `limit` non-English sentences of Tatoeba's `lang`-eng test pairs (evaluation data)."""
    path = root / "tatoeba" / f"tatoeba.{lang}-eng.{lang}"
    if not path.is_file():
        raise FileNotFoundError(f"required data file missing: {path}")
    with open(path, encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(limit)]


def udhr_lines(root: Path, name: str) -> list[str]:
    path = root / "udhr" / f"{name}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"required data file missing: {path}")
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def build_vocab(root: Path, out: Path, vocab_size: int = 2000, lines_per_lang: int = 1500,
                udhr: tuple[str, ...] = ()) -> Path:
    """WordPiece over Multi30k train (de/fr/cs/en), plus the named UDHR texts for other scripts."""
    from tokenizers import BertWordPieceTokenizer

    texts = [line for lang in (*LANGS, "en") for line in read_multi30k(root, "train", lang, lines_per_lang)]
    texts += [line for name in udhr for line in udhr_lines(root, name)]
    tokenizer = BertWordPieceTokenizer(lowercase=False, strip_accents=False, clean_text=True)
    tokenizer.train_from_iterator(texts, vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    out.mkdir(parents=True, exist_ok=True)
    vocab = out / "vocab.txt"
    ordered = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    assert [token for token, _ in ordered[:5]] == SPECIALS
    vocab.write_text("".join(token + "\n" for token, _ in ordered), encoding="utf-8")
    return vocab


def write_shards(root: Path, vocab: Path, out: Path, pairs_per_lang: int = 128, num_shards: int = 2,
                 split: str = "train", max_seq_length: int = 32) -> str:
    """Shards of `pairs_per_lang` pairs per language (xx -> en); returns their glob."""
    from pipelines.io.completion import mark_complete
    from pipelines.io.tfrecord import TFRecordWriter, encode_example

    tokenizer = hf_tokenizer(vocab)
    english = read_multi30k(root, split, "en", pairs_per_lang)
    records = []
    for lang in LANGS:
        source = read_multi30k(root, split, lang, pairs_per_lang)
        src_ids = tokenizer(source, truncation=True, max_length=max_seq_length)["input_ids"]
        tgt_ids = tokenizer(english, truncation=True, max_length=max_seq_length)["input_ids"]
        for s, t, s_text, t_text in zip(src_ids, tgt_ids, source, english):
            records.append(encode_example({"src_ids": s, "tgt_ids": t, "src_lang": lang, "tgt_lang": "en",
                                           "score": 1.0, "src_text": s_text, "tgt_text": t_text}))
    out.mkdir(parents=True, exist_ok=True)
    for shard in range(num_shards):
        with TFRecordWriter(out / f"pairs-{shard:05d}-of-{num_shards:05d}.tfrecord") as writer:
            for record in records[shard::num_shards]:
                writer.write(record)
    mark_complete(out, {"records": len(records)}, stage="test shards")  # readers require it, as for labse-tfrecords
    return str(out / "*.tfrecord")


def tiny_dual_encoder(vocab_size: int, dtype=None, seed: int = 0, dropout: float = 0.0):
    """The `tiny` DualEncoder with seeded weights, float64 unless `dtype` says otherwise (exactness tests)."""
    import torch

    from labse_model.config import ModelConfig
    from labse_model.encoder import DualEncoder

    torch.manual_seed(seed)
    config = ModelConfig.from_preset("tiny", vocab_size, hidden_dropout=dropout, attention_dropout=dropout)
    return DualEncoder(config).to(torch.float64 if dtype is None else dtype)


def multi30k_batch(root: Path, vocab: Path, pairs: int) -> dict:
    """The first `pairs` Multi30k train de-en pairs as a padded trainer batch."""
    tokenizer = hf_tokenizer(vocab)
    src = tokenizer(read_multi30k(root, "train", "de", pairs), padding=True, return_tensors="pt")
    tgt = tokenizer(read_multi30k(root, "train", "en", pairs), padding=True, return_tensors="pt")
    return {"src_input_ids": src["input_ids"], "src_attention_mask": src["attention_mask"],
            "tgt_input_ids": tgt["input_ids"], "tgt_attention_mask": tgt["attention_mask"]}


def free_port() -> int:
    """A loopback port for a server the test starts later (torch's TCPStore, torchrun's rendezvous).

    Choosing a port and binding it later is a race: another process may bind it in between. This
    narrows it: the port is left in TIME_WAIT by a connection accepted and closed on the server side
    first, so for about a minute a plain bind of it (or the kernel's choice for another `bind(0)`)
    is refused, while a server that binds with SO_REUSEADDR, as the two above do, still takes it.
    What remains of the race is retried by `spawn_on_free_port`."""
    import socket

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server side closes first: TIME_WAIT is on (127.0.0.1, port)
            client.recv(1)
    return port


def spawn_on_free_port(run, args_with_port, nprocs: int, tries: int = 3) -> None:
    """`torch.multiprocessing.spawn(run, args=args_with_port(port), nprocs=nprocs)` on a `free_port`,
    again on another one when rank 0 found it taken (EADDRINUSE) between choice and bind."""
    import torch.multiprocessing as mp

    for attempt in range(1, tries + 1):
        try:
            mp.spawn(run, args=args_with_port(free_port()), nprocs=nprocs)
            return
        except mp.ProcessRaisedException as error:
            if attempt == tries or "EADDRINUSE" not in str(error):
                raise


def set_torchrun_environment(rank: int, world: int, port: int) -> None:
    """What torchrun would set, for a process started by `torch.multiprocessing.spawn`."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))


def max_relative_difference(a: dict, b: dict) -> float:
    """Largest absolute difference over the tensors of `b`, relative to the largest entry of `b`."""
    scale = max(t.abs().max().item() for t in b.values())
    return max((a[name] - b[name]).abs().max().item() for name in b) / scale


def save_tiny_sentence_transformer(work: Path, out: Path) -> Path:
    """A tiny randomly initialised BERT (hidden size 32) saved in sentence-transformers format under
    `out`, as labse-export does; `work` holds its vocabulary and Hugging Face files."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghijklmnopqrstuvwxyzäöü.")
    vocab += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    (work / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(work / "vocab.txt"), do_lower_case=False)
    assert len(tokenizer) == len(vocab)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(work / "hf")
    tokenizer.save_pretrained(work / "hf")
    modules = [models.Transformer(str(work / "hf"), max_seq_length=32), models.Pooling(32, "cls")]
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out
