"""labse-distill: a static miner (`pipelines.embed.static`) taught by a sentence encoder the toolkit already runs."""
