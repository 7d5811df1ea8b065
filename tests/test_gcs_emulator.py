"""The local Cloud Storage the object-store tests run against answers Beam's GCS IO (write, match,
batch rename: what every stage's atomic write uses) and gcsfs (what the trainer reads shards with)."""
import subprocess
import sys
import textwrap


def test_beam_writes_lists_and_renames_on_the_emulator(gcs):
    bucket = gcs.new_bucket()
    script = textwrap.dedent(f"""
        import apache_beam as beam
        from apache_beam.io.filesystems import FileSystems
        with beam.Pipeline() as p:
            p | beam.Create(["one", "two"]) | beam.io.WriteToText("gs://{bucket}/out/part")
        [match] = FileSystems.match(["gs://{bucket}/out/*"])
        [path] = [m.path for m in match.metadata_list]
        FileSystems.rename([path], ["gs://{bucket}/out/renamed.txt"])
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    objects = gcs.list(f"gs://{bucket}/out")
    assert list(objects) == ["renamed.txt"]
    assert sorted(objects["renamed.txt"].decode().split()) == ["one", "two"]


def test_gcsfs_reads_what_was_uploaded(gcs, tmp_path):
    import gcsfs

    bucket = gcs.new_bucket()
    (tmp_path / "a.bin").write_bytes(b"\x00\x01payload")
    gcs.upload_tree(tmp_path, f"gs://{bucket}/data")
    fs = gcsfs.GCSFileSystem()
    assert fs.cat(f"{bucket}/data/a.bin") == b"\x00\x01payload"
    assert fs.ls(f"{bucket}/data") == [f"{bucket}/data/a.bin"]


def test_a_plain_object_in_a_bucket_lies_in_no_stage_output_until_the_root_is_marked(gcs, tmp_path):
    # Looking upwards for a stage output reaches the bucket's root, where `gs://BUCKET.lock` is
    # no object name (GCS IO refuses it): the root can only be marked, not locked.
    from pipelines.io.completion import SUCCESS_MARKER, require_stage_output, stage_output_root

    bucket = gcs.new_bucket()
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "en.txt").write_text("one line\n")
    gcs.upload_tree(tmp_path, f"gs://{bucket}")
    assert stage_output_root(f"gs://{bucket}/text/en.txt") is None
    assert require_stage_output(f"gs://{bucket}/text/en.txt", plain_allowed=True) is None
    (tmp_path / SUCCESS_MARKER).write_text("{}")
    gcs.upload_tree(tmp_path, f"gs://{bucket}")
    assert stage_output_root(f"gs://{bucket}/text/en.txt") == f"gs://{bucket}"
