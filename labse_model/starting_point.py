"""What `labse-train --init-from PATH` starts from, resolved to one `StartingPoint`.

LaBSE is not trained from scratch: the paper starts from a pre-trained (MLM/TLM) BERT, and users
fine-tune the released model for languages it lacks. PATH may be any of:

  run             a labse-train run directory (its latest checkpoint), a checkpoint folder, or a
                  model.safetensors; the architecture comes from the run's config.json when the
                  weights sit in a run directory, else from --config/--pooling (a bare file says nothing)
  pretrain        a labse-pretrain output directory: encoder.safetensors (`bert.*` keys),
                  pretrain_config.json ({"model": ModelConfig, "vocab_sha256": ...}), vocab.txt
  huggingface     a local Hugging Face BERT directory: config.json, model.safetensors or
                  pytorch_model.bin (BertModel, or BertForPreTraining/BertForMaskedLM with `bert.` prefix), vocab.txt
  sentence-transformers
                  a directory with modules.json: Transformer -> Pooling [-> Dense] [-> Normalize], as the
                  released sentence-transformers/LaBSE is laid out

Whatever the kind, the result holds the ModelConfig (the source's architecture), the weights under
`SentenceEncoder` names, the vocabulary file the source tokenises with, and which parts the source
legitimately lacks (LaBSE's dense head is new at fine-tuning when the source has none): those are
initialised fresh and named in a log line. Every other missing or unexpected weight is an error that
names the keys, so a wrong directory never trains from half-random weights.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from labse_model import checkpoint as ckpt
from pipelines.io import storage
from pipelines.io.storage import local_child
from labse_model.config import POOLING_MODES, PRESETS, ModelConfig, RunConfig, count_vocab, file_sha256
from pipelines.io.config_options import UsageError

logger = logging.getLogger(__name__)

PRETRAIN_WEIGHTS = "encoder.safetensors"
PRETRAIN_CONFIG = "pretrain_config.json"
VOCAB_FILE = "vocab.txt"
# BERT weight files in the order transformers prefers them; the index files list the shards of a split model.
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# Weights of BERT checkpoints that our encoder has no place for and that do not affect its output:
# the MLM/NSP pre-training heads (BertForPreTraining, BertForMaskedLM) and the position-id buffer that
# older transformers versions saved (it is always 0..max_positions-1).
UNUSED_BERT_PREFIXES = ("cls.",)
UNUSED_BERT_KEYS = ("embeddings.position_ids",)
HEAD_PREFIX = "head."
# The BERT architecture `ModelConfig.to_bert_config` builds; a source with other values cannot be represented.
FIXED_BERT_SETTINGS = {"hidden_act": "gelu", "type_vocab_size": 2, "layer_norm_eps": 1e-12,
                       "position_embedding_type": "absolute"}
ARCHITECTURE_FIELDS = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "max_position_embeddings")


@dataclass
class StartingPoint:
    """Everything the trainer takes from `--init-from`."""

    kind: str  # "run", "pretrain", "huggingface" or "sentence-transformers"
    source: Path
    # The source's architecture; None only for a bare weights file outside a run directory.
    model: ModelConfig | None
    # Whether the source fixes the pooling (run configs, sentence-transformers Pooling); BERT
    # checkpoints and pre-training outputs do not, so --pooling chooses it.
    defines_pooling: bool
    weights: dict[str, torch.Tensor]  # under SentenceEncoder's state-dict names
    vocab: Path | None  # the vocab.txt the source tokenises with (None: a bare weights file)
    # Key prefixes the source legitimately lacks; the encoder keeps its fresh initialisation there.
    fresh_prefixes: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)  # what was read but not used, for the log

    def check_matches(self, model: ModelConfig) -> None:
        """Raise unless the weights fit an encoder of `model` (built on the meta device: no memory used)."""
        from labse_model.encoder import SentenceEncoder

        with torch.device("meta"):
            self._fresh_keys(SentenceEncoder(model).state_dict())

    def load_into(self, encoder: torch.nn.Module) -> None:
        """Copy the weights into `encoder` (a SentenceEncoder), strictly: see the module docstring."""
        fresh = self._fresh_keys(encoder.state_dict())
        encoder.load_state_dict(self.weights, strict=False)  # copies, casting e.g. float16 sources to float32
        logger.info("initialised the encoder from %s (%s)", self.source, self.kind)
        for note in self.notes:
            logger.info("--init-from %s: %s", self.source, note)
        if fresh:
            logger.info("freshly initialised (the source has no such weights): %s", ", ".join(fresh))

    def _fresh_keys(self, expected: dict[str, torch.Tensor]) -> list[str]:
        """The encoder's keys the source legitimately lacks; ValueError naming any other mismatch."""
        fresh = sorted(k for k in expected if k not in self.weights and k.startswith(self.fresh_prefixes))
        missing = sorted(set(expected) - set(self.weights) - set(fresh))
        unexpected = sorted(set(self.weights) - set(expected))
        if missing or unexpected:
            hint = " (was it trained with a different --config?)" if self.model is None else ""
            raise UsageError(f"--init-from {self.source} ({self.kind}) does not match the encoder: "
                             f"missing {_some(missing)}, unexpected {_some(unexpected)}{hint}")
        wrong_shapes = [f"{k} {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in self.weights.items()
                        if v.shape != expected[k].shape]
        if wrong_shapes:
            raise UsageError(f"--init-from {self.source} ({self.kind}): weights of another shape: {_some(wrong_shapes)}")
        return fresh


def _some(keys: list[str], limit: int = 10) -> str:
    shown = ", ".join(keys[:limit])
    return f"[{shown}{f', ... {len(keys) - limit} more' if len(keys) > limit else ''}]"


# ----------------------------------------------------------------------------------------------
# Resolving a path


def load_starting_point(path: str | Path) -> StartingPoint:
    """Recognise what PATH is and read it; FileNotFoundError/ValueError say what was expected.

    PATH on object storage (gs://...) is first copied to this host (`run_store.fetch_model`: a run
    gives one complete checkpoint, checked against its marker's sha256), then read the same way."""
    if storage.is_remote(path):
        from labse_model.run_store import fetch_model

        local = fetch_model(str(path))
        logger.info("--init-from %s: read from its copy %s", path, local)
        return load_starting_point(local)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--init-from {path} does not exist")
    if path.is_file():
        if path.suffix != ".safetensors":
            raise UsageError(f"--init-from {path}: a file must be a model.safetensors of a labse-train checkpoint")
        return _from_run_weights(path)
    if (path / "modules.json").is_file():
        return _from_sentence_transformers(path)
    if (path / PRETRAIN_WEIGHTS).is_file() or (path / PRETRAIN_CONFIG).is_file():
        return _from_pretrain(path)
    if (path / ckpt.MODEL_FILE).is_file() and (path / ckpt.STATE_FILE).is_file():
        return _from_run_weights(path / ckpt.MODEL_FILE)
    if (path / "checkpoints").is_dir() or _is_run_config(path / "config.json"):
        # The newest checkpoint whose weights read back; FileNotFoundError names a run without checkpoints.
        choice = ckpt.choose_checkpoint(path, ckpt.read_checkpoint_weights,
                                        choose_hint=f"--init-from {path}/checkpoints/step-N picks another")
        return _from_run_weights(choice.path / ckpt.MODEL_FILE, choice.loaded)
    if (path / "config.json").is_file():
        return _from_huggingface(path)
    raise UsageError(
        f"--init-from {path}: not a labse-train run or checkpoint, a labse-pretrain output ({PRETRAIN_WEIGHTS}), "
        "a Hugging Face BERT directory (config.json) or a sentence-transformers directory (modules.json)"
    )


def _is_run_config(path: Path) -> bool:
    return path.is_file() and {"model", "train"} <= set(_read_json(path))


def _from_run_weights(weights_file: Path, weights: dict[str, torch.Tensor] | None = None) -> StartingPoint:
    """A labse-train checkpoint's model.safetensors (`weights`, if already read); the run around it,
    if any, gives config and vocabulary."""
    weights = read_tensors(weights_file) if weights is None else weights
    checkpoint = weights_file.parent
    run_dir = checkpoint.parent.parent
    is_in_run = (ckpt.STEP_DIR.match(checkpoint.name) and checkpoint.parent.name == "checkpoints"
                 and (run_dir / "config.json").is_file())
    if not is_in_run:
        return StartingPoint("run", weights_file, None, False, weights, None)
    config = RunConfig.load(run_dir / "config.json")
    return StartingPoint("run", weights_file, config.model, True, weights, run_dir / VOCAB_FILE)


def _from_pretrain(path: Path) -> StartingPoint:
    for name in (PRETRAIN_WEIGHTS, PRETRAIN_CONFIG, VOCAB_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(f"--init-from {path}: labse-pretrain output without {name}")
    pretrain_config = _read_json(path / PRETRAIN_CONFIG)
    model = _model_config_from_dict(pretrain_config.get("model"), path / PRETRAIN_CONFIG)
    recorded = pretrain_config.get("vocab_sha256")
    if recorded != file_sha256(path / VOCAB_FILE):
        raise UsageError(f"--init-from {path}: {VOCAB_FILE} is not the vocabulary the encoder was pre-trained with "
                         f"({PRETRAIN_CONFIG} records sha256 {recorded})")
    _check_vocab(path / VOCAB_FILE, model.vocab_size, path)
    # Pre-training has no sentence head: LaBSE's dense layer is new at fine-tuning.
    return StartingPoint("pretrain", path, model, False, read_tensors(path / PRETRAIN_WEIGHTS), path / VOCAB_FILE,
                         fresh_prefixes=(HEAD_PREFIX,))


def _model_config_from_dict(data, where: Path) -> ModelConfig:
    if not isinstance(data, dict):
        raise UsageError(f"{where}: no \"model\" object (a ModelConfig)")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    if set(data) - known:
        raise UsageError(f"{where}: model settings this trainer does not know: {sorted(set(data) - known)}")
    return ModelConfig(**data)


def _from_huggingface(path: Path) -> StartingPoint:
    """A BERT directory. Its pooler (dense+tanh on [CLS], where labse-export also puts LaBSE's head)
    initialises the head; without one the head starts fresh."""
    bert, notes = _read_bert(path)
    weights = {f"bert.{k}": v for k, v in bert.items() if not k.startswith("pooler.")}
    if "pooler.dense.weight" in bert:
        weights.update({"head.weight": bert["pooler.dense.weight"], "head.bias": bert["pooler.dense.bias"]})
        notes.append("the dense head starts from the BERT pooler (dense+tanh on [CLS])")
    model = _model_config_from_bert(path)
    vocab = _check_vocab(path / VOCAB_FILE, model.vocab_size, path)
    _refuse_lower_casing(path / "tokenizer_config.json", path)
    return StartingPoint("huggingface", path, model, False, weights, vocab, fresh_prefixes=(HEAD_PREFIX,), notes=notes)


def _from_sentence_transformers(path: Path) -> StartingPoint:
    modules = _read_modules(path)
    transformer_dir = path / modules["Transformer"]
    bert, notes = _read_bert(transformer_dir)
    if any(k.startswith("pooler.") for k in bert):
        notes.append("BERT's pooler is not used (sentence-transformers pools with its Pooling module)")
    weights = {f"bert.{k}": v for k, v in bert.items() if not k.startswith("pooler.")}
    model = _model_config_from_bert(transformer_dir)
    hidden = model.hidden_size
    pooling = _read_pooling(path / modules["Pooling"], hidden)
    if "Dense" in modules:
        weights.update(_read_dense(path / modules["Dense"], hidden))
    if "Normalize" not in modules:
        notes.append("the source does not L2-normalise; the trainer and labse-export do (cosines are unchanged)")
    model = dataclasses.replace(model, pooling=pooling, dense_head="Dense" in modules)
    vocab_dir = transformer_dir if (transformer_dir / VOCAB_FILE).is_file() else path
    vocab = _check_vocab(vocab_dir / VOCAB_FILE, model.vocab_size, path)
    _refuse_lower_casing(transformer_dir / "sentence_bert_config.json", path)
    _refuse_lower_casing(transformer_dir / "tokenizer_config.json", path)
    return StartingPoint("sentence-transformers", path, model, True, weights, vocab, notes=notes)


# ----------------------------------------------------------------------------------------------
# Reading the parts


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file, or a PyTorch .bin read with `weights_only=True` (never unpickles code);
    a damaged file, or one holding more than tensors, is a CorruptCheckpointError naming it."""
    if path.suffix == ".safetensors":
        return ckpt.read_weights(path)
    tensors = ckpt.read_torch_file(path)
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise ckpt.CorruptCheckpointError(f"{path} is not a valid weights file: not a state dict of tensors")
    return tensors


def _read_weight_files(directory: Path) -> dict[str, torch.Tensor]:
    for name in HF_WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if name.endswith(".index.json"):  # a split checkpoint: the index names its shard files
            shards = sorted(set(_read_json(path)["weight_map"].values()))
            return {k: v for shard in shards for k, v in read_tensors(directory / shard).items()}
        return read_tensors(path)
    raise FileNotFoundError(f"{directory}: no BERT weights (looked for {', '.join(HF_WEIGHT_FILES)})")


def _read_bert(directory: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """BertModel weights under BertModel names (pooler included if saved) and notes on what was dropped."""
    raw = _read_weight_files(directory)
    notes = []
    dropped = sorted(k for k in raw if k.startswith(UNUSED_BERT_PREFIXES))
    if dropped:
        notes.append(f"pre-training heads not used: {_some(dropped, 3)}")
    raw = {k: v for k, v in raw.items() if not k.startswith(UNUSED_BERT_PREFIXES)}
    # BertForPreTraining / BertForMaskedLM save the encoder under "bert."; a BertModel saves it bare.
    prefixed = [k for k in raw if k.startswith("bert.")]
    if prefixed and len(prefixed) != len(raw):
        others = sorted(k for k in raw if not k.startswith("bert."))
        raise UsageError(f"{directory}: weights both with and without the 'bert.' prefix: {_some(others)}")
    bert = {k.removeprefix("bert."): v for k, v in raw.items()}
    # Checkpoints converted from TensorFlow name LayerNorm parameters gamma/beta (transformers renames them too).
    bert = {_modern_layer_norm_name(k): v for k, v in bert.items() if k not in UNUSED_BERT_KEYS}
    return bert, notes


def _modern_layer_norm_name(key: str) -> str:
    if key.endswith("LayerNorm.gamma"):
        return key.removesuffix("gamma") + "weight"
    if key.endswith("LayerNorm.beta"):
        return key.removesuffix("beta") + "bias"
    return key


def _model_config_from_bert(directory: Path) -> ModelConfig:
    config = _read_json(directory / "config.json")
    if config.get("model_type") != "bert":
        raise UsageError(f"{directory}/config.json: model_type {config.get('model_type')!r}; only BERT encoders "
                         "can be represented by this trainer")
    absent = [name for name in ("vocab_size", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                "intermediate_size", "max_position_embeddings") if name not in config]
    if absent:
        raise UsageError(f"{directory}/config.json lacks {absent}: not a BERT config")
    different = {name: config[name] for name, value in FIXED_BERT_SETTINGS.items()
                 if name in config and config[name] not in (value, None)}
    if different:
        raise UsageError(f"{directory}/config.json: settings this trainer's BERT cannot represent: {different} "
                         f"(it uses {FIXED_BERT_SETTINGS})")
    return ModelConfig(
        vocab_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        num_heads=config["num_attention_heads"],
        intermediate_size=config["intermediate_size"],
        max_position_embeddings=config["max_position_embeddings"],
        pad_token_id=config.get("pad_token_id") or 0,
        preset="custom",  # the architecture is the source's, not one of PRESETS
    )


def _read_modules(path: Path) -> dict[str, str]:
    """modules.json -> {"Transformer": folder, "Pooling": folder, ...}, refusing what we cannot represent."""
    entries = _read_json(path / "modules.json")
    if not isinstance(entries, list) or not all(
            isinstance(entry, dict) and isinstance(entry.get("idx"), int) and isinstance(entry.get("type"), str)
            for entry in entries):
        raise UsageError(f"{path}/modules.json must be a list of modules, each with an integer \"idx\" and a "
                         "\"type\" (as sentence-transformers writes it)")
    entries = sorted(entries, key=lambda entry: entry["idx"])
    names = [entry["type"].rsplit(".", 1)[-1] for entry in entries]
    valid = names[:2] == ["Transformer", "Pooling"] and names[2:] in ([], ["Dense"], ["Normalize"], ["Dense", "Normalize"])
    if not valid:
        raise UsageError(f"{path}/modules.json: modules {[entry['type'] for entry in entries]} cannot be represented; "
                         "the trainer's encoder is Transformer -> Pooling [-> Dense] [-> Normalize]")
    folders = {name: entry.get("path", "") for name, entry in zip(names, entries)}
    for name, folder in folders.items():
        # A module folder is a relative path inside the directory ("" for the Transformer of the
        # released LaBSE): an absolute path or `..` would read weights from anywhere.
        where = f"{path}/modules.json: the {name} module's path leaves the directory"
        if not isinstance(folder, str):
            raise UsageError(f"{where} ({folder!r} is not a folder name)")
        if folder:
            local_child(path, folder, source=where)
    return folders


def _read_pooling(directory: Path, hidden: int) -> str:
    config = _read_json(directory / "config.json")
    if "pooling_mode" in config:
        modes = [config["pooling_mode"]] if isinstance(config["pooling_mode"], str) else list(config["pooling_mode"])
    else:  # sentence-transformers before 5: one boolean per mode (the released LaBSE's file)
        modes = [key.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
                 for key, on in config.items() if key.startswith("pooling_mode_") and on]
        modes = modes or ["mean"]  # what sentence-transformers does when none is set
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise UsageError(f"{directory}/config.json: pooling {modes} cannot be represented; the trainer pools with "
                         f"one of {list(POOLING_MODES)}")
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension", hidden))
    if dimension != hidden:
        raise UsageError(f"{directory}/config.json: pooling dimension {dimension} != the encoder's {hidden}")
    return modes[0]


def _read_dense(directory: Path, hidden: int) -> dict[str, torch.Tensor]:
    """The Dense module as the encoder's head; only LaBSE's form (hidden -> hidden, bias, tanh) fits."""
    config = _read_json(directory / "config.json")
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    shape = (config.get("in_features"), config.get("out_features"))
    if not activation.endswith(".Tanh") or shape != (hidden, hidden) or not config.get("bias", True) \
            or config.get("use_residual", False):
        raise UsageError(f"{directory}/config.json: Dense {shape[0]}->{shape[1]}, activation {activation}, "
                         f"bias {config.get('bias', True)}, residual {config.get('use_residual', False)} cannot be "
                         f"represented; the trainer's head is Dense {hidden}->{hidden} with bias and tanh")
    tensors = next((read_tensors(directory / name) for name in ("model.safetensors", "pytorch_model.bin")
                    if (directory / name).is_file()), None)
    if tensors is None:
        raise FileNotFoundError(f"{directory}: no Dense weights (model.safetensors or pytorch_model.bin)")
    # Our head is the Dense module's linear layer; any other weight in the file is unexpected for load_into.
    return {HEAD_PREFIX + k.removeprefix("linear."): v for k, v in tensors.items()}


def _check_vocab(vocab: Path, vocab_size: int, source: Path) -> Path:
    """The source's vocab.txt, usable by labse-tfrecords and with one token per embedding row."""
    from pipelines.text.wordpiece import load_vocab

    if not vocab.is_file():
        raise FileNotFoundError(f"--init-from {source}: no {VOCAB_FILE} (the vocabulary labse-tfrecords must tokenise with)")
    tokens = load_vocab(vocab)  # VocabError (a ValueError) if the special tokens are not at ids 0-4
    if len(tokens) != vocab_size:
        raise UsageError(f"--init-from {source}: {vocab} has {len(tokens)} tokens but the model {vocab_size} embeddings")
    return vocab


def _refuse_lower_casing(config_file: Path, source: Path) -> None:
    # labse-tfrecords tokenises cased (no lower-casing, accents kept): an uncased vocabulary would see
    # every capitalised word as [UNK].
    if config_file.is_file() and _read_json(config_file).get("do_lower_case"):
        raise UsageError(f"--init-from {source}: {config_file.name} says do_lower_case; this toolkit tokenises "
                         "cased text, so only cased models can be fine-tuned")


# ----------------------------------------------------------------------------------------------
# The run's model and vocabulary


def model_config_for_run(start: StartingPoint, preset: str | None, pooling: str | None, dropout: float,
                         vocab_size: int) -> ModelConfig:
    """The run's ModelConfig: the source's architecture; --config/--pooling only where the source is silent.

    `preset`/`pooling` are None when not given on the command line; given and contradicting the
    source, they are an error. `vocab_size` is used only for a bare weights file (no config).
    """
    if start.model is None:
        return ModelConfig.from_preset(preset or "base", vocab_size, hidden_dropout=dropout,
                                       attention_dropout=dropout, pooling=pooling or "cls")
    model = start.model
    if preset is not None:
        wanted = {name: PRESETS[preset][name] for name in ARCHITECTURE_FIELDS}
        actual = {name: getattr(model, name) for name in ARCHITECTURE_FIELDS}
        if wanted != actual:
            raise UsageError(f"--config {preset} {wanted} contradicts --init-from {start.source} {actual}: "
                             "leave --config out, the architecture comes from the starting point")
    if pooling is not None and start.defines_pooling and pooling != model.pooling:
        raise UsageError(f"--pooling {pooling} contradicts --init-from {start.source}, which pools with "
                         f"{model.pooling}: leave --pooling out")
    return dataclasses.replace(model, pooling=pooling or model.pooling, hidden_dropout=dropout,
                               attention_dropout=dropout)


def check_run_vocab(start: StartingPoint, vocab: str | Path) -> None:
    """--vocab must be the starting point's vocabulary: the shards' ids index its embeddings."""
    if start.vocab is None:
        return
    if file_sha256(vocab) != file_sha256(start.vocab):
        raise UsageError(f"--vocab {vocab} is not the vocabulary of --init-from {start.source} ({start.vocab}): "
                         f"the shards must be made by labse-tfrecords --vocab {start.vocab}, and --vocab must be "
                         "that file")
