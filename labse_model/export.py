"""labse-export: a training checkpoint -> a sentence-transformers directory (contract 13), loaded offline.

    labse-export --run runs/labse --output models/labse [--step 50000]

The directory has the released LaBSE's layout: Transformer (BertModel weights, vocab.txt, a cased
tokenizer saved with its normaliser) -> Pooling (cls, mean or max: the run's `--pooling`)
-> Dense (tanh) -> Normalize (no Dense for a run started from a model without one), so

    SentenceTransformer("models/labse").encode(sentences)

gives the trainer's embeddings. The BertModel is saved WITH its pooler set to LaBSE's dense head,
as in the released LaBSE: loading the folder with plain `transformers.BertModel` then also gives
`pooler_output` = the sentence embedding before normalisation (for cls pooling), and no weight is
reported missing.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from pipelines.io.console import add_verbose_option, start_logging
from pipelines.io.atomic import durable_replace, make_tree_shareable
from labse_model import checkpoint as ckpt
from pipelines.io import storage
from labse_model.config import RunConfig
from labse_model.encoder import SentenceEncoder
from pipelines.io.config_options import UsageError

logger = logging.getLogger(__name__)


def load_encoder(run_dir: Path, step: int | None = None) -> tuple[SentenceEncoder, RunConfig, Path]:
    """The trained `SentenceEncoder` of a run, in eval mode on CPU: the checkpoint of `step`, or by
    default the newest one whose weights read back (a warning line names any corrupt newer one)."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: is {run_dir} a labse-train run directory?")
    config = RunConfig.load(config_path)
    choice = ckpt.choose_checkpoint(run_dir, ckpt.read_checkpoint_weights, step)
    if not ckpt.records_digest(choice.path / ckpt.MODEL_FILE):
        logger.warning("%s carries no sha256 digest (written by an older labse-train): damage that keeps its size "
                       "cannot be detected; exporting it as it reads", choice.path / ckpt.MODEL_FILE)
    zeroed = zeroed_weights(choice.loaded)
    if zeroed:
        logger.warning("%s: %d weight matrices are all zeros (%s%s): the file is damaged (zero-filled) or was "
                       "never trained; exporting it as it reads", choice.path / ckpt.MODEL_FILE, len(zeroed),
                       ", ".join(zeroed[:3]), ", ..." if len(zeroed) > 3 else "")
    encoder = SentenceEncoder(config.model)
    ckpt.apply_model_weights(encoder, choice.loaded, choice.path / ckpt.MODEL_FILE)
    encoder.eval()
    return encoder, config, choice.path


def zeroed_weights(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the weight matrices (2-D or more) that hold only zeros. Biases may be zero; a
    matrix of a trained (or even a freshly initialised) encoder never is, so such a matrix means
    bytes zeroed on disk or in a copy, which only a recorded digest would otherwise catch."""
    return sorted(name for name, tensor in tensors.items()
                  if tensor.dim() >= 2 and tensor.numel() and not torch.count_nonzero(tensor))


def bert_for_export(encoder: SentenceEncoder):
    """A `transformers.BertModel` holding the encoder's weights, its pooler = LaBSE's dense head.

    An encoder without a dense head (`ModelConfig.dense_head = False`) is saved without a pooler:
    there is nothing to put there.
    """
    from transformers import BertModel

    has_head = encoder.head is not None
    bert = BertModel(encoder.bert.config, add_pooling_layer=has_head)
    missing, unexpected = bert.load_state_dict(encoder.bert.state_dict(), strict=False)
    if unexpected or set(missing) - {"pooler.dense.weight", "pooler.dense.bias"}:
        raise RuntimeError(f"BERT weights do not map: missing {missing}, unexpected {unexpected}")
    if has_head:
        with torch.no_grad():
            bert.pooler.dense.weight.copy_(encoder.head.weight)
            bert.pooler.dense.bias.copy_(encoder.head.bias)
    return bert.eval()


def export_sentence_transformer(run_dir: Path, output: Path, step: int | None = None,
                                max_seq_length: int | None = None, overwrite: bool = False) -> Path:
    """Write the sentence-transformers directory atomically (staged beside `output`, then renamed),
    holding the output lock (`OUTPUT.lock`, `pipelines.io.locks`) so two exports never race.
    The staged rename is the completion: a directory at `output` is always whole. An output that
    is, contains or lies inside the run directory is refused before anything is removed."""
    from pipelines.io.locks import output_lock
    from pipelines.io.overlap import check_output_apart

    output = Path(output)
    check_output_apart(output, [run_dir])
    if output.is_symlink():
        # Replacing it would swap the link for a directory (or rmtree refuses it with a traceback):
        # the user means the directory it points to, or another path.
        raise UsageError(f"--output {output} is a symbolic link (to {os.readlink(output)}): give the directory "
                         "itself, or another path")
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"{output} is an existing file, not a directory: choose a directory for --output")
    with output_lock(output):
        return _export_locked(run_dir, output, step, max_seq_length, overwrite)


def _export_locked(run_dir: Path, output: Path, step: int | None, max_seq_length: int | None,
                   overwrite: bool) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer

    from pipelines.text.wordpiece import hf_tokenizer

    if output.exists() and any(output.iterdir()) and not overwrite:
        raise FileExistsError(f"{output} exists and is not empty (pass --overwrite to replace it)")
    encoder, config, checkpoint = load_encoder(run_dir, step)
    max_seq_length = max_seq_length or config.train.max_seq_length
    if max_seq_length > config.model.max_position_embeddings:
        raise UsageError(f"--max-seq-length {max_seq_length} > the model's {config.model.max_position_embeddings} positions")

    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=f".{output.name}.hf-") as hf_dir:
        bert_for_export(encoder).save_pretrained(hf_dir, safe_serialization=True)
        tokenizer = hf_tokenizer(Path(run_dir) / "vocab.txt", model_max_length=max_seq_length)
        tokenizer.save_pretrained(hf_dir)
        transformer = Transformer(hf_dir, max_seq_length=max_seq_length, do_lower_case=False)
        hidden = config.model.hidden_size
        pooling = Pooling(hidden, pooling_mode=config.model.pooling)  # "cls", "mean" or "max", as trained
        head = []
        if encoder.head is not None:
            head = [Dense(hidden, hidden, bias=True, activation_function=torch.nn.Tanh(),
                          init_weight=encoder.head.weight.detach().clone(),
                          init_bias=encoder.head.bias.detach().clone())]
        model = SentenceTransformer(modules=[transformer, pooling, *head, Normalize()], device="cpu")
        staging = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.staging-"))
        try:
            model.save(str(staging))
            # transformers 5 saves only tokenizer.json; vocab.txt keeps the folder usable by
            # BertTokenizer, TF Text and labse-tfrecords (the same ids, one token per line).
            shutil.copyfile(Path(run_dir) / "vocab.txt", staging / "vocab.txt")
            make_tree_shareable(staging)
            if output.exists():
                shutil.rmtree(output)
            durable_replace(staging, output)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    logger.info("exported %s to %s", checkpoint, output)
    return output


def export(run: str | Path, output: str | Path, step: int | None = None, max_seq_length: int | None = None,
           overwrite: bool = False) -> str | Path:
    """`export_sentence_transformer`, with `run` and `output` local or on object storage.

    A run there is copied first (its config, vocab.txt and one complete checkpoint, checked against
    its marker: `run_store.fetch_run`); an output there is written into a local temporary folder,
    then uploaded under `OUTPUT.lock` with `_SUCCESS` last (`run_store.publish_directory`)."""
    from labse_model.run_store import fetch_run, publish_directory
    from pipelines.io.overlap import check_output_apart

    check_output_apart(output, [run])  # before the run is fetched or anything is removed
    if storage.is_remote(run):
        run, checkpoint = fetch_run(str(run), step)
        step = int(ckpt.STEP_DIR.match(checkpoint.name).group(1))
    if not storage.is_remote(output):
        return export_sentence_transformer(Path(run), Path(output), step, max_seq_length, overwrite)
    if storage.walk(str(output)) and not overwrite:  # before the work; checked again under the lock
        raise FileExistsError(f"{output} exists and is not empty (pass --overwrite to replace it)")
    with tempfile.TemporaryDirectory(prefix="labse-export-") as staging:
        local = export_sentence_transformer(Path(run), Path(staging) / "model", step, max_seq_length)
        publish_directory(local, str(output), overwrite=overwrite)
    logger.info("uploaded the export to %s", output)
    return output


def main(argv: list[str] | None = None) -> int:
    from labse_model.cli import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="labse-export",
        description="Export a labse-train checkpoint as a sentence-transformers directory "
        "(Transformer -> Pooling cls/mean/max, as trained -> Dense tanh, unless the model has none -> Normalize) "
        "that loads offline.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--run", required=True, type=storage.path_argument,
                        help="the labse-train run directory (gs://...: its newest complete checkpoint is copied here)")
    parser.add_argument("--output", required=True, type=storage.path_argument,
                        help="the sentence-transformers directory to write (gs://...: written here, uploaded, "
                        "_SUCCESS last)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--max-seq-length", type=int, default=None,
                        help="tokens per sentence at inference (default: the training --max-seq-length)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = add_verbose_option(parser).parse_args(start_logging(argv, "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    from labse_model.cli import exit_status

    status = exit_status(lambda: export(args.run, args.output, args.step, args.max_seq_length, args.overwrite))
    if status:
        return status
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
