"""Every SDK worker of a stage's run sends its outputs to the runner in buffers of at most ~1 MB and
lets go of each buffer when its bundle finishes (`pipelines.beam_worker`, imported by the workers
as a Beam plugin): a worker's memory no longer grows with the number of stages and outputs it ran."""
from __future__ import annotations

import json
import os

import apache_beam as beam
from apache_beam import coders
from apache_beam.runners import common
from apache_beam.runners.worker import bundle_processor, data_plane, statesampler
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.counters import CounterFactory

from pipelines import stage

ROW = b"x" * 100_000


def run_output_operation(rows: int) -> tuple[bundle_processor.DataOutputOperation, list]:
    """A runner-bound output of one bundle, as Beam's worker builds it, fed `rows` ROWs; the data
    messages the runner received."""
    channel = data_plane.InMemoryDataChannel()
    counters = CounterFactory()
    operation = bundle_processor.DataOutputOperation(
        common.NameContext("out"), "out", {}, counters, statesampler.StateSampler("test", counters),
        coders.WindowedValueCoder(coders.BytesCoder()), "out", lambda _: channel)
    operation.set_output_stream(channel.output_stream("bundle", "out"))
    operation.start()
    for _ in range(rows):
        operation.process(GlobalWindows.windowed_value(ROW))
    operation.finish()
    return operation, list(channel.inverse().input_elements("bundle", ["out"]))


def test_an_output_is_sent_in_small_buffers_and_let_go_when_its_bundle_finishes():
    from pipelines.beam_worker import OUTPUT_FLUSH_BYTES, bound_output_buffers

    bound_output_buffers()
    bound_output_buffers()  # twice is once
    operation, messages = run_output_operation(100)
    assert operation.output_stream is None
    assert len(messages) >= 9
    assert max(len(m.data) for m in messages) <= OUTPUT_FLUSH_BYTES + len(ROW) + 64
    decoder = coders.WindowedValueCoder(coders.BytesCoder()).get_impl()
    from apache_beam.coders.coder_impl import create_InputStream

    received = []
    for message in messages:
        stream = create_InputStream(message.data)
        while stream.size():
            received.append(decoder.decode_from_stream(stream, True).value)
    assert received == [ROW] * 100


def test_every_worker_of_a_run_bounds_its_outputs_before_its_first_bundle(tmp_path):
    pipeline = stage.beam_pipeline(["--direct_running_mode", "multi_processing", "--direct_num_workers", "1"])
    seen = tmp_path / "seen"

    def report(element):  # a nested function travels by value: the worker imports no project module for it
        from apache_beam.runners.worker import bundle_processor as worker_side

        with open(seen / str(os.getpid()), "w") as out:
            json.dump(getattr(worker_side.DataOutputOperation.finish, "releases_output_buffer", False), out)
        return element

    seen.mkdir()
    with pipeline:
        _ = pipeline | beam.Create([1, 2, 3]) | beam.Map(report)
    reports = {path.name: json.loads(path.read_text()) for path in seen.iterdir()}
    assert reports and str(os.getpid()) not in reports
    assert all(reports.values()), reports


def _grouping_buffer(keys: int):
    """The DirectRunner's buffer of a GroupByKey's output: `keys` keys, one ROW each."""
    from apache_beam.coders.coder_impl import create_OutputStream
    from apache_beam.runners.portability.fn_api_runner import execution
    from apache_beam.transforms import core

    pre = coders.WindowedValueCoder(coders.TupleCoder([coders.VarIntCoder(), coders.BytesCoder()]))
    post = coders.WindowedValueCoder(coders.TupleCoder([coders.VarIntCoder(), coders.IterableCoder(coders.BytesCoder())]))
    buffer = execution.GroupingBuffer(pre, post, core.Windowing(GlobalWindows()))
    out = create_OutputStream()
    for key in range(keys):
        pre.get_impl().encode_to_stream(GlobalWindows.windowed_value((key, ROW)), out, True)
    buffer.append(out.get())
    return buffer, post.get_impl()


def test_the_direct_runner_sends_a_workers_share_in_pieces_between_elements():
    """A grouping's share of ~3 MB goes to its worker in messages of ~1 MB, each a whole number of
    grouped elements, and other inputs' pieces go one message each (they went as one message)."""
    from apache_beam.coders.coder_impl import create_InputStream
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    from pipelines.beam_worker import INPUT_PIECE_BYTES, bound_runner_inputs

    bound_runner_inputs()
    bound_runner_inputs()  # twice is once
    buffer, grouped = _grouping_buffer(keys=60)  # 60 elements of ~100 KB: 3 MB a share
    parts = buffer.partition(2)
    assert parts is buffer.partition(2) and [len(part) for part in parts] == [3, 3]
    for number, part in enumerate(parts):
        assert all(len(piece) <= INPUT_PIECE_BYTES + len(ROW) + 64 for piece in part)
        keys = []
        for piece in part:
            stream = create_InputStream(piece)
            while stream.size():
                key, values = grouped.decode_from_stream(stream, True).value
                keys.append(key)
                assert list(values) == [ROW]
        assert keys == list(range(number, 60, 2))  # the runner's round robin, every element once

    class Manager:
        _worker_handler = type("Handler", (), {"data_conn": data_plane.InMemoryDataChannel()})()

    fn_runner.BundleManager._send_input_to_worker(Manager(), "bundle", "in", parts[0])
    messages = list(Manager._worker_handler.data_conn.inverse().input_elements("bundle", ["in"]))
    assert [len(m.data) for m in messages if m.data] == [len(piece) for piece in parts[0]]
