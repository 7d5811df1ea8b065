"""Apache Beam pipelines: cleaning, main-content filtering, mining, scoring and TFRecord writing."""
