"""The mining stage (labse-mine): config, embedders, kNN search and margins (no Beam), Beam transforms, CLI."""
