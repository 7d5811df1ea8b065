"""What the project changes in Beam's SDK workers and in the DirectRunner: the memory a data
message between them keeps.

Imported by every SDK worker when it starts (a Beam plugin: `beam_pipeline` names this module in
`--beam_plugins`, which every runner's workers import first, Dataflow's included) and by the
launcher, where the DirectRunner's in-process worker runs.

Beam (2.77, pinned) encodes each runner-bound output of a bundle into a buffer that doubles as it
grows and is sent when it passes 10 MB, so it reaches ~16 MB; the operation keeps the closed
buffer until the next bundle of the same stage replaces it, and the worker caches each stage's
operations for 60 s. A worker therefore held ~16 MB for every runner-bound output of every stage it
had run: labse-mine's global layout grew from ~290 MB a worker at 10x to ~500-600 MB at 100x
(BENCHMARKS.md, "labse-mine worker memory"). Here a closed buffer goes with its bundle, and a
buffer is sent past OUTPUT_FLUSH_BYTES, the size the Java SDK's harness sends by default.

The DirectRunner's side (its FnApiRunner, in the launcher) sent each worker its whole share of a
stage's input as one data message: a grouping's share encoded in one piece, other inputs' pieces
joined. A worker held that message (~10-12 MB a stage at 200,000 sentences a side in labse-mine,
against ~1 MB at 20,000) while it worked through it. Here a share goes in messages of about
INPUT_PIECE_BYTES, which the worker's bounded receive queue takes as it consumes them (Dataflow
streams a worker's input from its shuffle: nothing to change there)."""
from __future__ import annotations

# Sent when a bundle's buffered output to the runner passes this size (Beam's Python default: 10 MB).
OUTPUT_FLUSH_BYTES = 1 << 20
# The DirectRunner's input to a worker goes in messages of about this size (elements are not split).
INPUT_PIECE_BYTES = 1 << 20


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


def bound_runner_inputs() -> None:
    """From now on, in this process, the DirectRunner sends each worker its input in messages of
    about INPUT_PIECE_BYTES: a grouping's share (in the global window, as the project's pipelines
    group) encoded in pieces, each closed once it passes that size, and each piece of any input
    sent on its own. Idempotent."""
    from apache_beam.coders.coder_impl import create_OutputStream
    from apache_beam.runners.portability.fn_api_runner import execution, fn_runner
    from apache_beam.transforms.window import GlobalWindow, GlobalWindows
    from apache_beam.utils import windowed_value

    manager = fn_runner.BundleManager
    if getattr(manager._send_input_to_worker, "sends_pieces", False):
        return
    partition = execution.GroupingBuffer.partition

    def partition_in_pieces(self, n: int) -> list:
        """Beam's `GroupingBuffer.partition` (2.77) for the global window, with a share in pieces."""
        if self._grouped_output or not self._windowing.is_default():
            return partition(self, n)
        in_window = GlobalWindows.windowed_value(
            None, timestamp=GlobalWindow().max_timestamp(),
            pane_info=windowed_value.PaneInfo(is_first=True, is_last=True, timing=windowed_value.PaneInfoTiming.ON_TIME,
                                              index=0, nonspeculative_index=0)).with_value
        grouped, keys = self._post_grouped_coder.get_impl(), self._key_coder.get_impl()
        shares = [[create_OutputStream()] for _ in range(n)]
        for number, (encoded_key, values) in enumerate(self._table.items()):  # Beam's round robin
            share = shares[number % n]
            grouped.encode_to_stream(in_window((keys.decode(encoded_key), values)), share[-1], True)
            if share[-1].size() >= INPUT_PIECE_BYTES:
                share.append(create_OutputStream())
        self._grouped_output = [[piece.get() for piece in share if piece.size()] or [b""] for share in shares]
        self._table.clear()
        return self._grouped_output

    def send_pieces(self, process_bundle_id: str, read_transform_id: str, byte_streams) -> None:
        data_out = self._worker_handler.data_conn.output_stream(process_bundle_id, read_transform_id)
        for byte_stream in byte_streams or []:
            data_out.write(byte_stream)
            if data_out.size() >= INPUT_PIECE_BYTES:
                data_out.flush()
        data_out.close()

    send_pieces.sends_pieces = True
    execution.GroupingBuffer.partition, manager._send_input_to_worker = partition_in_pieces, send_pieces


bound_output_buffers()
bound_runner_inputs()
