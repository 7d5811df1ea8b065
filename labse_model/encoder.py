"""LaBSE's dual encoder: one BERT for both sides, [CLS] -> dense + tanh -> L2 normalisation.

This is the released LaBSE's head (sentence-transformers/LaBSE is Transformer, Pooling cls,
Dense tanh, Normalize), so `labse-export` maps it one to one onto sentence-transformers modules.
`ModelConfig.pooling = "mean"` (or "max") swaps [CLS] for the masked token mean (or max) in front of
the same head: trained from random weights, [CLS] learns little beyond sentence length
(BENCHMARKS.md, model). `ModelConfig.dense_head = False` drops the dense+tanh layer (pooling -> L2), the
layout of sentence-transformers models without a Dense module, so they can be fine-tuned as published.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from labse_model.config import ModelConfig


class SentenceEncoder(nn.Module):
    """Encodes token ids to unit-length sentence embeddings of size `hidden_size`."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        from transformers import BertModel

        self.config = config
        # BERT's own pooler is dense+tanh on [CLS] too, but it is built for NSP; LaBSE's head is a
        # separate dense layer, and keeping it out of BertModel keeps the export mapping explicit.
        self.bert = BertModel(config.to_bert_config(), add_pooling_layer=False)
        self.head: nn.Linear | None = None
        if config.dense_head:
            self.head = nn.Linear(config.hidden_size, config.hidden_size)
            self.bert._init_weights(self.head)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = pool_tokens(hidden, attention_mask, self.config.pooling)
        if self.head is not None:
            pooled = torch.tanh(self.head(pooled))
        if pooled.dtype in (torch.float16, torch.bfloat16):
            # Normalise in float32: under bf16 autocast the norm of a 768-vector loses digits.
            pooled = pooled.float()
        return F.normalize(pooled, p=2, dim=-1)


def pool_tokens(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """[CLS] vector, or the mean or the element-wise max over real tokens ([CLS]/[SEP] included).

    The same arithmetic as sentence-transformers' Pooling modes "cls", "mean" and "max", so the
    exported model reproduces the trainer's embeddings.
    """
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        # Padding positions must never win the max: -inf, as sentence-transformers fills them. Every
        # row holds at least [CLS] and [SEP], so no row is all -inf.
        return hidden.masked_fill(attention_mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def pad_to(ids: torch.Tensor, length: int, pad_id: int) -> torch.Tensor:
    if ids.shape[1] == length:
        return ids
    return F.pad(ids, (0, length - ids.shape[1]), value=pad_id)


class DualEncoder(nn.Module):
    """Shared-weight dual encoder: sources and targets go through the same `SentenceEncoder`.

    Both sides run in ONE forward (padded to the longer side and stacked): one pass is faster than
    two, and DDP sees each parameter used once per step.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.encoder = SentenceEncoder(config)
        self.pad_id = config.pad_token_id

    def forward(
        self,
        src_input_ids: torch.Tensor,
        src_attention_mask: torch.Tensor,
        tgt_input_ids: torch.Tensor,
        tgt_attention_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        length = max(src_input_ids.shape[1], tgt_input_ids.shape[1])
        ids = torch.cat([pad_to(src_input_ids, length, self.pad_id), pad_to(tgt_input_ids, length, self.pad_id)])
        mask = torch.cat([pad_to(src_attention_mask, length, 0), pad_to(tgt_attention_mask, length, 0)])
        embeddings = self.encoder(ids, mask)
        batch = src_input_ids.shape[0]
        return embeddings[:batch], embeddings[batch:]
