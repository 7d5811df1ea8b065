"""The scoring stage (labse-score): features, scorer, calibration and thresholds (no Beam), Beam transforms, CLI;
`bucc` is `labse-eval mining`."""
