"""Tokenizers for a `vocab.txt` built by `labse-vocab`: TF Text and HF `transformers`, same ids.

`vocab.txt` is a plain BERT WordPiece vocabulary (one token per line, `##` continuation prefix,
`[PAD] [UNK] [CLS] [SEP] [MASK]` at ids 0..4), so it also loads unchanged in TF Text's
`BertTokenizer`/`FastBertTokenizer(lower_case=False)` and in
`transformers.BertTokenizerFast(vocab=PATH, do_lower_case=False)`. Note: in transformers 5.x the
argument is `vocab=`; `vocab_file=` is silently ignored and leaves a 5-token vocabulary.

Loaded "raw" like that, the libraries disagree on rare input: TF Text turns control characters
into spaces while BERT/HF removes them, TF Text's `\\s` is ASCII-only (U+3000, U+00A0 do not split
words there), TF Text measures the 100 limit for a word in bytes and HF in characters, HF matches
`[MASK]` typed inside text as a special token, and the two ship different Unicode versions. The
two classes below remove every one of those differences (`pipelines.text.pretokenize` has the rules), and
tests/test_vocab_tokenizer.py checks they give identical ids on every Unicode code point and on
real sentences in many scripts. Use them rather than the raw classes when ids must match.

We use TF Text's `BertTokenizer` rather than `FastBertTokenizer`: after our cleaning both agree
with HF except on a handful of rare code points, but only `BertTokenizer` returns word boundaries,
which we need to apply HF's 100-*character* word limit exactly.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from pipelines.io.config_options import UsageError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)
SUFFIX = "##"
# A longer word becomes a single [UNK] (BERT's and HF's `max_input_chars_per_word`).
MAX_CHARS_PER_WORD = 100


class VocabError(UsageError):
    """vocab.txt is missing, empty, or not a BERT vocabulary of this project."""


def vocab_lines(raw: bytes, path: str | os.PathLike) -> list[str]:
    """The tokens of the bytes of a vocab.txt, one a line ("\n"; a "\r" before it is dropped), every
    line checked: UTF-8, not empty, no whitespace inside (the tokenizer splits there, so such a
    token could never be produced), not a repeat. VocabError names the file and the line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise VocabError(f"{path}:{line}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    tokens = [line.removesuffix("\r") for line in text.split("\n")]
    if tokens and tokens[-1] == "":
        tokens.pop()
    first_line: dict[str, int] = {}
    for number, token in enumerate(tokens, 1):
        if not token.strip():
            raise VocabError(f"{path}:{number}: an empty line; a vocabulary holds one token on every line")
        if any(ch.isspace() for ch in token):
            raise VocabError(f"{path}:{number}: token {token!r} contains whitespace, which the tokenizer splits "
                             "on; a token is one word piece")
        if token in first_line:  # two ids for one token: the tokenizer would silently use one of them
            raise VocabError(f"{path}: token {token!r} appears twice (lines {first_line[token]} and {number})")
        first_line[token] = number
    return tokens


def load_vocab(path: str | os.PathLike) -> list[str]:
    """Tokens of a vocab.txt in id order, checking every line (`vocab_lines`) and the reserved tokens."""
    path = Path(path)
    if not path.is_file():
        raise VocabError(f"vocabulary file not found: {path}")
    tokens = vocab_lines(path.read_bytes(), path)
    if tokens[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
        raise VocabError(f"{path}: the first tokens must be {SPECIAL_TOKENS}, got {tokens[:5]}")
    return tokens


class TFTextTokenizer:
    """TF Text `BertTokenizer` (cased, accents kept) on text cleaned like HF; ids as lists.

    Built once per worker (for example in `DoFn.setup`); `tokenize_ids` takes a batch.
    """

    def __init__(self, vocab_path: str | os.PathLike):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf
        import tensorflow_text as tf_text

        self.vocab = load_vocab(vocab_path)
        self.vocab_path = str(vocab_path)
        longest = max(len(token[len(SUFFIX):] if token.startswith(SUFFIX) else token) for token in self.vocab)
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self.vocab), tf.range(len(self.vocab), dtype=tf.int64)
            ),
            default_value=UNK_ID,
        )
        self._tf = tf
        from tensorflow_text.python.ops.bert_tokenizer import BasicTokenizer

        self._basic = BasicTokenizer(lower_case=False, keep_whitespace=False, normalization_form=None)
        self._wordpiece = tf_text.WordpieceTokenizer(
            table,
            suffix_indicator=SUFFIX,
            # bytes; 4 bytes per character at most, so only our character limit below applies
            max_bytes_per_word=4 * MAX_CHARS_PER_WORD,
            max_chars_per_token=longest,
            token_out_type=tf.int64,
            unknown_token="[UNK]",
            split_unknown_characters=False,
        )

    def __len__(self) -> int:
        return len(self.vocab)

    def tokenize_words(self, texts: list[str]) -> list[list[str]]:
        """The pre-tokenised words TF Text sees (for reports and debugging)."""
        from pipelines.text.pretokenize import clean_text

        words = self._basic.tokenize([clean_text(text) for text in texts])
        return [[w.decode("utf-8") for w in row] for row in words.to_list()]

    def tokenize_ids(self, texts: list[str]) -> list[list[int]]:
        """Word-piece ids per text, without [CLS]/[SEP]."""
        from pipelines.text.pretokenize import clean_text

        if not texts:
            return []
        tf = self._tf
        words = self._basic.tokenize(tf.constant([clean_text(text).encode("utf-8") for text in texts]))
        pieces = self._wordpiece.tokenize(words)  # [texts, words, pieces]
        word_chars = tf.strings.length(words.flat_values, unit="UTF8_CHAR").numpy()
        text_splits = pieces.row_splits.numpy()  # texts -> words
        word_splits = pieces.values.row_splits.numpy()  # words -> pieces
        ids = pieces.flat_values.numpy()

        pieces_per_word = np.diff(word_splits)
        too_long = word_chars > MAX_CHARS_PER_WORD
        if too_long.any():
            piece_word = np.repeat(np.arange(len(pieces_per_word)), pieces_per_word)
            first_piece = np.arange(len(ids)) == word_splits[piece_word]
            keep = ~too_long[piece_word] | first_piece
            ids = ids[keep]
            ids[too_long[piece_word[keep]]] = UNK_ID
            pieces_per_word = np.where(too_long, 1, pieces_per_word)
        piece_splits = np.concatenate([[0], np.cumsum(pieces_per_word)])[text_splits]
        return [row.tolist() for row in np.split(ids, piece_splits[1:-1])]


def hf_tokenizer(vocab_path: str | os.PathLike, model_max_length: int = 512):
    """A transformers fast tokenizer giving the same ids as `TFTextTokenizer`.

    Built from `BertTokenizerFast(vocab=PATH, do_lower_case=False)` (transformers 5.x: `vocab=`;
    `vocab_file=` is silently ignored), then our rules go into its Rust normaliser and
    pre-tokeniser. It is returned as a `PreTrainedTokenizerFast` over that backend, not as
    `BertTokenizerFast`: on `from_pretrained` the BERT class rebuilds its normaliser and
    pre-tokeniser from flags and would drop the rules, while this class loads tokenizer.json
    verbatim, so `save_pretrained` -> `AutoTokenizer.from_pretrained` (and a sentence-transformers
    export) tokenises exactly as training did. Same call API, [CLS] ... [SEP] template, padding.
    """
    from transformers import BertTokenizerFast, PreTrainedTokenizerFast

    from pipelines.text.pretokenize import bert_normalizer, bert_pre_tokenizer

    vocab = load_vocab(vocab_path)
    bert = BertTokenizerFast(vocab=str(vocab_path), do_lower_case=False, tokenize_chinese_chars=True, strip_accents=False)
    if len(bert) != len(vocab):
        raise VocabError(f"transformers loaded {len(bert)} tokens from {vocab_path}, expected {len(vocab)}")
    backend = bert.backend_tokenizer
    backend.normalizer = bert_normalizer()
    backend.pre_tokenizer = bert_pre_tokenizer()
    backend.model.max_input_chars_per_word = MAX_CHARS_PER_WORD
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=model_max_length,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        # "[MASK]" typed inside a sentence is text, as in TF Text, not the special token
        # (transformers re-applies this flag to the backend on every call).
        split_special_tokens=True,
    )
    if len(tokenizer) != len(vocab):
        raise VocabError(f"tokenizer has {len(tokenizer)} tokens, vocab.txt {len(vocab)}")
    return tokenizer
