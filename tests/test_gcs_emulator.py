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
