"""BERT with a masked-LM head evaluated only at the masked positions (pre-training's model).

The head is BERT's: transform (dense, GELU, LayerNorm), then a decoder whose weight IS the word
embedding matrix (tied, not copied), plus a bias. Logits are computed only for the rows that carry
a target: at a 500k vocabulary, logits for every position of a batch (B x L x 500k floats) do not
fit in memory, while B x 80 do. `bert` is built exactly as `SentenceEncoder.bert`, so its weights
load into the dual encoder unchanged (`labse-train --init-from PT_DIR`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from labse_model.config import ModelConfig


class MaskedLMHead(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, layer_norm_eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        transformed = self.layer_norm(F.gelu(self.dense(hidden)))
        return F.linear(transformed, word_embeddings, self.bias)


class MaskedLanguageModel(nn.Module):
    """`forward` returns the mean cross-entropy over the targets and the count of correct guesses."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        from transformers import BertModel

        self.config = config
        bert_config = config.to_bert_config()
        self.bert = BertModel(bert_config, add_pooling_layer=False)
        self.head = MaskedLMHead(config.hidden_size, config.vocab_size, bert_config.layer_norm_eps)
        self.bert._init_weights(self.head.dense)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mlm_rows: torch.Tensor,
                mlm_columns: torch.Tensor, mlm_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.head(hidden[mlm_rows, mlm_columns], self.bert.embeddings.word_embeddings.weight)
        # The softmax in float32: under bf16 autocast a 500k-way log-sum-exp loses digits.
        logits = logits.float()
        loss = F.cross_entropy(logits, mlm_labels)
        correct = (logits.argmax(dim=-1) == mlm_labels).sum()
        return loss, correct

    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        """The BERT weights under `SentenceEncoder`'s names (`bert.*`), for PT_DIR/encoder.safetensors."""
        return {f"bert.{name}": tensor for name, tensor in self.bert.state_dict().items()}
