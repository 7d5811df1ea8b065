"""Additive-margin softmax: a hand-computed example, margin on positives only, both directions."""
import math

import pytest
import torch
import torch.nn.functional as F

from labse_model.loss import BidirectionalAMSLoss, additive_margin_logits

# Unit vectors: cos(src_i, tgt_j) = [[1.0, 0.6], [0.0, 0.8]]
SRC = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
TGT = torch.tensor([[1.0, 0.0], [0.6, 0.8]])


def test_hand_computed_example():
    # margin 0.3, scale 10. Source->target logits: row 0 [7, 6], row 1 [0, 5];
    # target->source logits (cosines transposed): row 0 [7, 0], row 1 [6, 5].
    s2t = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(-5))) / 2
    t2s = (math.log(1 + math.exp(-7)) + math.log(1 + math.exp(1))) / 2
    assert s2t == pytest.approx(0.159989, abs=1e-6)
    assert t2s == pytest.approx(0.657087, abs=1e-6)
    loss = BidirectionalAMSLoss(additive_margin=0.3, scale=10.0)(SRC, TGT)
    assert loss.item() == pytest.approx(s2t + t2s, abs=1e-5)


def test_margin_only_on_positives():
    logits, labels = additive_margin_logits(SRC, TGT, additive_margin=0.3, scale=10.0)
    cosines = SRC @ TGT.T
    assert labels.tolist() == [0, 1]
    assert torch.allclose(logits.diagonal(), 10.0 * (cosines.diagonal() - 0.3))
    off_diagonal = ~torch.eye(2, dtype=torch.bool)
    assert torch.allclose(logits[off_diagonal], 10.0 * cosines[off_diagonal])
    # With an offset (gathered keys), the margin lands on column offset + i and nowhere else.
    keys = torch.cat([TGT, TGT.flip(0)])
    shifted, labels = additive_margin_logits(SRC, keys, additive_margin=0.3, scale=10.0, label_offset=2)
    assert labels.tolist() == [2, 3]
    expected = 10.0 * (SRC @ keys.T)
    expected[0, 2] -= 3.0
    expected[1, 3] -= 3.0
    assert torch.allclose(shifted, expected)


def test_margin_raises_loss_and_zero_margin_is_plain_softmax():
    generator = torch.Generator().manual_seed(0)
    src = F.normalize(torch.randn(8, 16, generator=generator), dim=-1)
    tgt = F.normalize(src + 0.5 * torch.randn(8, 16, generator=generator), dim=-1)
    plain = BidirectionalAMSLoss(additive_margin=0.0, scale=20.0)(src, tgt)
    labels = torch.arange(8)
    reference = F.cross_entropy(20 * src @ tgt.T, labels) + F.cross_entropy(20 * tgt @ src.T, labels)
    assert plain.item() == pytest.approx(reference.item(), rel=1e-6)
    assert BidirectionalAMSLoss(additive_margin=0.3, scale=20.0)(src, tgt).item() > plain.item()


def test_both_directions_are_summed():
    s2t_only = BidirectionalAMSLoss(additive_margin=0.3, scale=10.0, bidirectional=False)(SRC, TGT)
    t2s_only = BidirectionalAMSLoss(additive_margin=0.3, scale=10.0, bidirectional=False)(TGT, SRC)
    both = BidirectionalAMSLoss(additive_margin=0.3, scale=10.0)(SRC, TGT)
    assert s2t_only.item() != pytest.approx(t2s_only.item(), abs=1e-3)  # the example is asymmetric
    assert both.item() == pytest.approx(s2t_only.item() + t2s_only.item(), abs=1e-6)


def test_gathered_losses_of_the_ranks_average_to_the_big_batch_loss(monkeypatch):
    """The identity behind gathered negatives: the mean over ranks of each rank's gathered loss ==
    the big batch's. Two 'ranks' in one process: the gather is replaced by the whole batch, the
    rank by each in turn, so the loss's own label offsets are what is checked."""
    import labse_model.loss as loss_module

    generator = torch.Generator().manual_seed(1)
    src = F.normalize(torch.randn(6, 8, generator=generator), dim=-1)
    tgt = F.normalize(torch.randn(6, 8, generator=generator), dim=-1)
    big = BidirectionalAMSLoss(additive_margin=0.3, scale=30.0)(src, tgt)
    gathered = BidirectionalAMSLoss(additive_margin=0.3, scale=30.0, gather_negatives=True)
    monkeypatch.setattr(loss_module, "get_world_size", lambda: 2)
    monkeypatch.setattr(loss_module, "all_gather_with_grad", lambda local: src if local.data_ptr() in (
        src[3:].data_ptr(), src[:3].data_ptr()) else tgt)
    per_rank = []
    for rank in range(2):
        monkeypatch.setattr(loss_module, "get_rank", lambda rank=rank: rank)
        per_rank.append(gathered(src[rank * 3 : (rank + 1) * 3], tgt[rank * 3 : (rank + 1) * 3]).item())
    assert big.item() == pytest.approx(sum(per_rank) / 2, rel=1e-6)
    # Without the gather each rank sees only its own 3 rows: a different (smaller-softmax) loss.
    local = BidirectionalAMSLoss(additive_margin=0.3, scale=30.0)
    assert big.item() != pytest.approx(sum(local(src[r * 3 : (r + 1) * 3], tgt[r * 3 : (r + 1) * 3]).item()
                                           for r in range(2)) / 2, rel=1e-3)


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="differ in shape"):
        BidirectionalAMSLoss()(SRC, TGT[:1])


def test_a_run_config_from_before_the_rename_loads_its_margin_as_the_additive_margin():
    """config.json of runs written when TrainConfig's field was `margin` (labse-train --margin):
    resume and export read it as `additive_margin`; a config written now round-trips."""
    import dataclasses

    from labse_model.config import ModelConfig, RunConfig, TrainConfig

    written = dataclasses.asdict(RunConfig(model=ModelConfig(vocab_size=100), train=TrainConfig(additive_margin=0.2)))
    assert RunConfig.from_dict(written).train.additive_margin == 0.2
    written["train"]["margin"] = written["train"].pop("additive_margin")
    assert RunConfig.from_dict(written).train.additive_margin == 0.2
