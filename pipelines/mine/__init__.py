"""The mining stage (labse-mine): config, kNN search and margins (no Beam), Beam transforms, CLI."""
