"""Held-out retrieval accuracy during training: token ids of dev pairs, encoded in eval mode."""
from __future__ import annotations

import glob
import logging
from pathlib import Path

import torch

from labse_model.encoder import SentenceEncoder
from labse_model.evaluate import retrieval_accuracy
from pipelines.io.parallel_text import is_parallel_text, parse_parallel_text
from pipelines.io.text_lines import read_lines
from pipelines.io.config_options import UsageError

logger = logging.getLogger(__name__)


def dev_text_files(spec: str, warn: bool = False) -> tuple[str, str] | None:
    """The two line-aligned text files `--dev-data` names, or None when it is a TFRecord glob.

    Text files are named as for `labse-tfrecords --parallel-text`: 'SRC_LANG:PATH,TGT_LANG:PATH'
    (`pipelines.io.parallel_text`). The older 'SRC_FILE:TGT_FILE' form is still read, for this
    release only: with `warn`, a warning line says so. A spec that matches files as a glob is a
    TFRecord glob, as before. ValueError for a malformed 'SRC_LANG:PATH,TGT_LANG:PATH'.
    """
    if glob.glob(spec):
        return None
    if is_parallel_text(spec):
        parsed = parse_parallel_text(spec, "--dev-data")
        return parsed.src_path, parsed.tgt_path
    if ":" in spec:
        src_path, tgt_path = spec.split(":", 1)
        if warn:
            logger.warning("--dev-data %s: the SRC_FILE:TGT_FILE form is deprecated and will be removed in the "
                           "next release; write SRC_LANG:%s,TGT_LANG:%s as for labse-tfrecords --parallel-text",
                           spec, src_path, tgt_path)
        return src_path, tgt_path
    return None


def load_dev_pairs(spec: str, vocab_path: str, max_pairs: int, max_seq_length: int) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of held-out pairs: a TFRecord glob, or line-aligned text 'SRC_LANG:PATH,TGT_LANG:PATH'
    (`dev_text_files`)."""
    text_files = dev_text_files(spec, warn=True)
    if text_files is not None:
        src_path, tgt_path = text_files
        for path in (src_path, tgt_path):
            if not Path(path).is_file():
                raise FileNotFoundError(f"--dev-data file not found: {path}")
        sources, targets = read_lines(src_path), read_lines(tgt_path)
        if len(sources) != len(targets):
            raise UsageError(f"--dev-data files are not line-aligned: {len(sources)} vs {len(targets)} lines")
        keep = [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()][:max_pairs]
        from pipelines.text.wordpiece import hf_tokenizer

        tokenizer = hf_tokenizer(vocab_path)
        encode = lambda texts: tokenizer(texts, truncation=True, max_length=max_seq_length)["input_ids"]  # noqa: E731
        return encode([s for s, _ in keep]), encode([t for _, t in keep])
    from labse_model.data import iter_pairs

    src_ids, tgt_ids = [], []
    for pair in iter_pairs(spec):
        src_ids.append(pair.src_ids[:max_seq_length])
        tgt_ids.append(pair.tgt_ids[:max_seq_length])
        if len(src_ids) >= max_pairs:
            break
    if not src_ids:
        raise UsageError(f"--dev-data {spec!r} holds no pairs")
    return src_ids, tgt_ids


@torch.no_grad()
def encode_ids(encoder: SentenceEncoder, sequences: list[list[int]], device: torch.device, batch_size: int = 128,
               pad_id: int = 0) -> torch.Tensor:
    """Sentence embeddings of token-id sequences, in eval mode (the encoder's mode is restored)."""
    from labse_model.data import pad_batch

    was_training = encoder.training
    encoder.eval()
    out = []
    for start in range(0, len(sequences), batch_size):
        ids, mask = pad_batch(sequences[start : start + batch_size], pad_id)
        out.append(encoder(ids.to(device), mask.to(device)).float().cpu())
    encoder.train(was_training)
    return torch.cat(out)


def pair_retrieval_accuracy(src: torch.Tensor, tgt: torch.Tensor) -> dict[str, float]:
    """Top-1 retrieval accuracy of row-aligned pairs in both directions and their mean."""
    src_np, tgt_np = src.numpy(), tgt.numpy()
    s2t, t2s = retrieval_accuracy(src_np, tgt_np), retrieval_accuracy(tgt_np, src_np)
    return {"src2tgt": s2t, "tgt2src": t2s, "mean": (s2t + t2s) / 2}
