"""What the project changes in Beam's SDK workers: the memory an output to the runner keeps.

Imported by every SDK worker when it starts (a Beam plugin: `beam_pipeline` names this module in
`--beam_plugins`, which every runner's workers import first, Dataflow's included) and by the
launcher, where the DirectRunner's in-process worker runs.

Beam (2.77, pinned) encodes each runner-bound output of a bundle into a buffer that doubles as it
grows and is sent when it passes 10 MB, so it reaches ~16 MB; the operation keeps the closed
buffer until the next bundle of the same stage replaces it, and the worker caches each stage's
operations for 60 s. A worker therefore held ~16 MB for every runner-bound output of every stage it
had run: labse-mine's global layout grew from ~290 MB a worker at 10x to ~500-600 MB at 100x
(BENCHMARKS.md, "labse-mine worker memory"). Here a closed buffer goes with its bundle, and a
buffer is sent past OUTPUT_FLUSH_BYTES, the size the Java SDK's harness sends by default."""
from __future__ import annotations

# Sent when a bundle's buffered output to the runner passes this size (Beam's Python default: 10 MB).
OUTPUT_FLUSH_BYTES = 1 << 20


def bound_output_buffers() -> None:
    """From now on, in this process, every runner-bound output (`DataOutputOperation`) sends its
    buffer once it passes OUTPUT_FLUSH_BYTES and lets go of it when its bundle finishes. Idempotent."""
    from apache_beam.runners.worker import bundle_processor, data_plane

    operation = bundle_processor.DataOutputOperation
    if getattr(operation.finish, "releases_output_buffer", False):
        return
    set_output_stream, finish = operation.set_output_stream, operation.finish

    def set_output_stream_sent_sooner(self, output_stream) -> None:
        if isinstance(output_stream, data_plane.SizeBasedBufferingClosableOutputStream):
            output_stream._size_flush_threshold = min(output_stream._size_flush_threshold, OUTPUT_FLUSH_BYTES)
        set_output_stream(self, output_stream)

    def finish_and_release(self) -> None:
        finish(self)
        self.output_stream = None  # closed and sent: nothing of it is read again

    finish_and_release.releases_output_buffer = True
    operation.set_output_stream, operation.finish = set_output_stream_sent_sooner, finish_and_release


bound_output_buffers()
