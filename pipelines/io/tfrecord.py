"""TFRecord files and `tf.train.Example` without TensorFlow.

GPU hosts run torch alone, so the trainer reads the shards that `labse-tfrecords` writes with this
module: the framing is checked record by record (length CRC and data CRC, both masked CRC32C as in
TensorFlow's `record_writer.cc`), and `tf.train.Example` is parsed with the `protobuf` runtime from a
descriptor built in code (wire-compatible with TensorFlow's `example.proto`, but registered in a
private descriptor pool, so it never clashes with TensorFlow's own classes in the same process).

A TFRecord file is a sequence of records::

    uint64 length          little endian
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

Beside each shard, `labse-tfrecords` writes its offset index, ``NAME.tfrecord.index``: the byte
offset of every record's header, in file order, as little-endian uint64 (8 bytes a record, nothing
else). The trainer reads a record with one ranged read from its offset to the next record's (the
last record ends at the file's end), so it never scans a shard to find its records.

A truncated or corrupt file raises `TFRecordCorruptError` naming the file and the byte offset of
the bad record. `google-crc32c` (C, hardware CRC instructions) computes the checksums.

This module lives in `pipelines.io`, the formats package both sides use: `labse-tfrecords` writes
the shards with it and the trainer (`labse_model.data`) reads them, so the dependency runs one way
(labse_model -> pipelines.io) and nothing here imports Beam, TensorFlow or torch.
"""
from __future__ import annotations

import os
import struct
from array import array
from dataclasses import dataclass
from typing import BinaryIO, Iterator, Mapping, Sequence

import google_crc32c as _google_crc32c
import numpy as np

from pipelines.io.atomic import durable_replace, write_bytes_atomic
from pipelines.io.config_options import UsageError

__all__ = [
    "TFRecordCorruptError",
    "crc32c",
    "masked_crc32c",
    "frame_record",
    "TFRecordWriter",
    "iter_records",
    "index_records",
    "read_record_at",
    "unframe_record",
    "INDEX_SUFFIX",
    "index_path",
    "encode_index",
    "decode_index",
    "Example",
    "encode_example",
    "decode_example",
    "example_to_dict",
]

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
HEADER_SIZE = _HEADER.size  # 12
FOOTER_SIZE = _FOOTER.size  # 4
_MASK_DELTA = 0xA282EAD8


class TFRecordCorruptError(UsageError):
    """A TFRecord file is truncated or a checksum does not match."""

    def __init__(self, path: str, offset: int, reason: str):
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(f"corrupt TFRecord file {path} at byte offset {offset}: {reason}")


# ---------------------------------------------------------------------------------------------
# CRC32C (Castagnoli): google-crc32c, a required dependency (C, SSE4.2/ARM CRC instructions)


def crc32c(data: bytes) -> int:
    """CRC32C of `data` (as an unsigned 32-bit int)."""
    return _google_crc32c.value(bytes(data))


CRC32C_IMPLEMENTATION = f"google-crc32c ({_google_crc32c.implementation})"


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# Framing

def frame_record(data: bytes) -> bytes:
    """One record as it lies in a TFRecord file."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


INDEX_SUFFIX = ".index"


def index_path(shard_path: str) -> str:
    """Where a shard's offset index lies: beside it, ``NAME.tfrecord.index``."""
    return f"{shard_path}{INDEX_SUFFIX}"


def encode_index(offsets: Sequence[int] | np.ndarray) -> bytes:
    """The bytes of an offset index: one little-endian uint64 per record."""
    return np.asarray(offsets, dtype="<u8").tobytes()


def decode_index(data: bytes, path: str) -> np.ndarray:
    """Record offsets (int64) from an index file's bytes; a size that is no multiple of 8 is corrupt."""
    if len(data) % 8:
        raise TFRecordCorruptError(path, len(data) - len(data) % 8, "offset index size is not a multiple of 8 bytes")
    offsets = np.frombuffer(data, dtype="<u8").astype(np.int64)
    if len(offsets) and (offsets[0] != 0 or bool((np.diff(offsets) < HEADER_SIZE + FOOTER_SIZE).any())):
        raise TFRecordCorruptError(path, 0, "offset index is not increasing from 0 by at least one record frame")
    return offsets


class TFRecordWriter:
    """Writes an uncompressed TFRecord file and its offset index atomically: temp files beside them,
    `os.replace` on close (the index first, so a shard never lies there without its index).

    Use as a context manager; on an exception the temp files are removed and the targets are untouched.
    """

    def __init__(self, path: str | os.PathLike, write_index: bool = True):
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._tmp = f"{self.path}.tmp-{os.getpid()}-{id(self):x}"
        self._file: BinaryIO | None = open(self._tmp, "wb")
        self._offsets: array | None = array("Q") if write_index else None
        self.num_records = 0
        self.num_bytes = 0

    def write(self, data: bytes) -> None:
        framed = frame_record(data)
        assert self._file is not None, "writer is closed"
        self._file.write(framed)
        if self._offsets is not None:
            self._offsets.append(self.num_bytes)
        self.num_records += 1
        self.num_bytes += len(framed)

    def close(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        if self._offsets is not None:
            write_bytes_atomic(index_path(self.path), encode_index(np.frombuffer(self._offsets, dtype=np.uint64)))
        durable_replace(self._tmp, self.path)

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _read_header(f: BinaryIO, path: str, offset: int) -> int | None:
    """Length of the record starting at `offset` (file positioned there); None at a clean end of file."""
    header = f.read(HEADER_SIZE)
    if not header:
        return None
    if len(header) < HEADER_SIZE:
        raise TFRecordCorruptError(path, offset, f"truncated record header ({len(header)} of {HEADER_SIZE} bytes)")
    length, length_crc = _HEADER.unpack(header)
    if masked_crc32c(header[:8]) != length_crc:
        if offset == 0 and header[:2] == b"\x1f\x8b":
            raise TFRecordCorruptError(path, offset, "GZIP-compressed TFRecord files are not supported: "
                                       "decompress them (gunzip) or write them uncompressed")
        raise TFRecordCorruptError(path, offset, "length checksum mismatch (not a TFRecord file, or corrupt)")
    return length


def _read_body(f: BinaryIO, path: str, offset: int, length: int, check_crc: bool) -> bytes:
    body = f.read(length + FOOTER_SIZE)
    if len(body) < length + FOOTER_SIZE:
        raise TFRecordCorruptError(
            path, offset, f"truncated record: expected {length + FOOTER_SIZE} bytes after the header, found {len(body)}"
        )
    data = body[:length]
    if check_crc:
        (data_crc,) = _FOOTER.unpack(body[length:])
        if masked_crc32c(data) != data_crc:
            raise TFRecordCorruptError(path, offset, "data checksum mismatch")
    return data


def iter_records(path: str | os.PathLike, check_crc: bool = True) -> Iterator[bytes]:
    """Stream the records of one uncompressed TFRecord file, checking both CRCs of every record."""
    path = os.fspath(path)
    with open(path, "rb", buffering=1 << 20) as f:
        offset = 0
        while True:
            length = _read_header(f, path, offset)
            if length is None:
                return
            yield _read_body(f, path, offset, length, check_crc)
            offset += HEADER_SIZE + length + FOOTER_SIZE


def index_records(path: str | os.PathLike) -> np.ndarray:
    """Byte offsets of every record in a file (int64), from a header-only scan.

    Each header's length CRC is checked and the file must end exactly after the last record, so a
    truncated file fails here, before training starts; data CRCs are checked when a record is read.
    """
    path = os.fspath(path)
    with open(path, "rb", buffering=1 << 20) as f:
        return index_open_records(f, path, os.path.getsize(path))


def index_open_records(f: BinaryIO, path: str, size: int) -> np.ndarray:
    """`index_records` of a file already open for reading (`size` bytes; e.g. an object-store stream)."""
    offsets: list[int] = []
    offset = 0
    while offset < size:
        f.seek(offset)
        length = _read_header(f, path, offset)
        if length is None:  # pragma: no cover - size says there is more
            break
        end = offset + HEADER_SIZE + length + FOOTER_SIZE
        if end > size:
            raise TFRecordCorruptError(
                path, offset, f"truncated record: needs {end - offset} bytes, the file has {size - offset} left"
            )
        offsets.append(offset)
        offset = end
    return np.asarray(offsets, dtype=np.int64)


def read_record_at(f: BinaryIO, path: str, offset: int, check_crc: bool = True) -> bytes:
    """The record whose header starts at `offset` in the open file `f`."""
    f.seek(offset)
    length = _read_header(f, path, offset)
    if length is None:
        raise TFRecordCorruptError(path, offset, "no record at this offset (end of file)")
    return _read_body(f, path, offset, length, check_crc)


def unframe_record(framed: bytes, path: str, offset: int, check_crc: bool = True) -> bytes:
    """The data of one whole framed record (header, data, footer: the bytes between two index offsets)."""
    if len(framed) < HEADER_SIZE + FOOTER_SIZE:
        raise TFRecordCorruptError(path, offset, f"truncated record: {len(framed)} bytes between index offsets")
    length, length_crc = _HEADER.unpack_from(framed)
    if masked_crc32c(framed[:8]) != length_crc:
        raise TFRecordCorruptError(path, offset, "length checksum mismatch (the offset index does not match the shard)")
    if HEADER_SIZE + length + FOOTER_SIZE != len(framed):
        raise TFRecordCorruptError(path, offset, f"record of {length} bytes does not fill the {len(framed)} bytes up to "
                                   "the next index offset (the offset index does not match the shard)")
    data = framed[HEADER_SIZE : HEADER_SIZE + length]
    if check_crc:
        (data_crc,) = _FOOTER.unpack_from(framed, HEADER_SIZE + length)
        if masked_crc32c(data) != data_crc:
            raise TFRecordCorruptError(path, offset, "data checksum mismatch")
    return data


# ---------------------------------------------------------------------------------------------
# tf.train.Example without TensorFlow

def _build_example_classes():
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf import message_factory

    F = descriptor_pb2.FieldDescriptorProto
    file_proto = descriptor_pb2.FileDescriptorProto(name="pipelines/io/example.proto", package="labse.tfexample", syntax="proto3")

    def message(name: str, fields: Sequence[tuple]) -> descriptor_pb2.DescriptorProto:
        msg = file_proto.message_type.add(name=name)
        for field_name, number, ftype, label, type_name, *oneof in fields:
            field = msg.field.add(name=field_name, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
            if oneof:
                field.oneof_index = oneof[0]
        return msg

    pkg = ".labse.tfexample."
    message("BytesList", [("value", 1, F.TYPE_BYTES, F.LABEL_REPEATED, None)])
    float_list = message("FloatList", [("value", 1, F.TYPE_FLOAT, F.LABEL_REPEATED, None)])
    float_list.field[0].options.packed = True
    int64_list = message("Int64List", [("value", 1, F.TYPE_INT64, F.LABEL_REPEATED, None)])
    int64_list.field[0].options.packed = True
    feature = message(
        "Feature",
        [
            ("bytes_list", 1, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, pkg + "BytesList", 0),
            ("float_list", 2, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, pkg + "FloatList", 0),
            ("int64_list", 3, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, pkg + "Int64List", 0),
        ],
    )
    feature.oneof_decl.add(name="kind")
    features = message("Features", [("feature", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, pkg + "Features.FeatureEntry")])
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=pkg + "Feature")
    message("Example", [("features", 1, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, pkg + "Features")])

    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("labse.tfexample.Example"))


Example = _build_example_classes()

FeatureValue = "bytes | str | float | int | Sequence[int] | Sequence[float] | Sequence[bytes]"


def encode_example(features: Mapping[str, object]) -> bytes:
    """Serialise a `tf.train.Example`.

    Values: `bytes`/`str` or a list of them -> bytes_list; `float` or a list of floats -> float_list;
    `int` or a list/array of ints -> int64_list.
    """
    example = Example()
    fmap = example.features.feature
    for name, value in features.items():
        if isinstance(value, (bytes, str)):
            value = [value]
        elif isinstance(value, (int, float, np.integer, np.floating)):
            value = [value]
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        value = list(value)  # type: ignore[arg-type]
        feature = fmap[name]
        if value and isinstance(value[0], (bytes, str)):
            feature.bytes_list.value.extend(v.encode("utf-8") if isinstance(v, str) else v for v in value)
        elif value and isinstance(value[0], float):
            feature.float_list.value.extend(value)
        else:
            feature.int64_list.value.extend(int(v) for v in value)
    return example.SerializeToString(deterministic=True)


def decode_example(data: bytes):
    """Parse serialized bytes into an `Example` message (raises `google.protobuf.message.DecodeError`)."""
    example = Example()
    example.ParseFromString(data)
    return example


def example_to_dict(data: bytes) -> dict[str, list]:
    """`{name: list of values}` for every feature of a serialized Example (bytes stay bytes)."""
    out: dict[str, list] = {}
    for name, feature in decode_example(data).features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = list(getattr(feature, kind).value) if kind else []
    return out


@dataclass(frozen=True)
class PairRecord:
    """One training pair as stored by `labse-tfrecords` (contract 8)."""

    src_ids: list[int]
    tgt_ids: list[int]
    src_lang: str
    tgt_lang: str
    score: float


def decode_pair(data: bytes, path: str = "?", offset: int = -1) -> PairRecord:
    """A `PairRecord` from a serialized Example; a record without ids raises a clear error."""
    try:
        fmap = decode_example(data).features.feature
    except Exception as exc:  # DecodeError, or anything upb raises on garbage
        raise TFRecordCorruptError(path, offset, f"record is not a tf.train.Example ({exc})") from exc
    for name in ("src_ids", "tgt_ids"):
        if name not in fmap or fmap[name].WhichOneof("kind") != "int64_list":
            raise TFRecordCorruptError(path, offset, f"Example has no int64 feature {name!r}")

    def text(name: str) -> str:
        if name in fmap and fmap[name].bytes_list.value:
            return fmap[name].bytes_list.value[0].decode("utf-8", "replace")
        return ""

    score = fmap["score"].float_list.value[0] if "score" in fmap and fmap["score"].float_list.value else float("nan")
    return PairRecord(
        src_ids=list(fmap["src_ids"].int64_list.value),
        tgt_ids=list(fmap["tgt_ids"].int64_list.value),
        src_lang=text("src_lang"),
        tgt_lang=text("tgt_lang"),
        score=float(score),
    )
