"""The cleaning stage (labse-clean): config, per-document and per-bundle logic (no Beam), Beam transforms, CLI."""
