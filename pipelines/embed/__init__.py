"""Sentence embedders for mining (issue 33 moves every embedder here; the static miner is the first)."""
