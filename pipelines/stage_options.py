"""A Beam stage's command line: its own options, and every other option handed to Apache Beam.

`stage_parser` builds it (`--output`, `--overwrite`, an epilog naming Beam's options);
`StageArgumentParser.parse_known_args` refuses, in one line with exit 2, an option that neither the
command nor Beam knows (Beam itself would only log "Discarding unparseable args" and run with the
default of the option the user misspelt). `usage_error` is the one way a CLI reports a refusal.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from pipelines.io.console import add_verbose_option

EXIT_USAGE = 2  # what every CLI returns for a refused output or a bad argument

BEAM_OPTIONS_HELP = ("Options the command does not know are passed to Apache Beam, e.g. --runner DataflowRunner "
                     "--project P --region R --temp_location gs://B/tmp --setup_file ./setup.py --requirements_file "
                     "dataflow/requirements.txt --requirements_cache skip (docs/guides/cloud.md), or "
                     "--direct_running_mode multi_processing --direct_num_workers 2. An option that neither "
                     "the command nor Beam knows is refused.")


class StageArgumentParser(argparse.ArgumentParser):
    """A Beam stage's parser: `parse_known_args` returns (the command's options, Beam's options)
    and refuses, in one line with exit 2, anything neither knows. No abbreviations: `--over` must
    not be taken for `--overwrite`, which deletes an output."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        unknown = unknown_beam_args(rest)
        if unknown:
            ours = [option for action in self._actions for option in action.option_strings]
            self.exit(EXIT_USAGE, f"{self.prog}: error: unrecognized arguments: {' '.join(unknown)} "
                                  f"(neither {self.prog} nor Apache Beam knows them{_suggestion(unknown, ours)})\n")
        return parsed, rest


def _beam_option_parser() -> argparse.ArgumentParser:
    """Every option Beam's PipelineOptions knows, built the way PipelineOptions.get_all_options does."""
    import apache_beam  # noqa: F401  (imports the runners' option classes too)
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # pylint: disable=protected-access
    return parser


def unknown_beam_args(beam_args: Sequence[str]) -> list[str]:
    """The arguments among `beam_args` that Beam's PipelineOptions does not know (empty when all are)."""
    if not beam_args:
        return []
    _, unknown = _beam_option_parser().parse_known_args(list(beam_args))
    return unknown


def _suggestion(unknown: Sequence[str], ours: Sequence[str]) -> str:
    import difflib

    known = list(ours) + [o for a in _beam_option_parser()._actions for o in a.option_strings]
    hints = []
    for arg in unknown:
        if arg.startswith("--"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=1)
            if close:
                hints.append(f"{arg.split('=', 1)[0]} -> {close[0]}?")
    return f"; did you mean {', '.join(hints)}" if hints else ""


def replace_help(where: str) -> str:
    """The help of --overwrite for an output named `where` (a path's name or --output)."""
    return f"replace an earlier run's output in {where} (without it an existing output is refused)"


def stage_parser(prog: str, description: str, *, output: str, overwrite: str = replace_help("--output"),
                 output_metavar: str | None = None, **parser_settings: Any) -> argparse.ArgumentParser:
    """The command line of a Beam stage: `prog`'s own options, with an epilog saying that any
    other option goes to Beam (the command parses with `parse_known_args` and gives the rest to
    `PipelineOptions`); an option neither knows is refused (StageArgumentParser). Every stage
    writes one output: `--output` (help `output`) and `--overwrite` (help `overwrite`)."""
    parser = StageArgumentParser(prog=prog, description=description, epilog=BEAM_OPTIONS_HELP, **parser_settings)
    parser.add_argument("--output", required=True, metavar=output_metavar, help=output)
    parser.add_argument("--overwrite", action="store_true", help=overwrite)
    return add_verbose_option(parser)


def usage_error(prog: str, message: str) -> int:
    """One line on stderr, the exit status for a refused argument or output."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE
