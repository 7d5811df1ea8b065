"""`python -m pipelines.tfrecords ...` runs `labse-tfrecords`."""
import sys

from pipelines.tfrecords.cli import main

sys.exit(main())
