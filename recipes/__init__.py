"""Orchestration on top of the product: recipes that drive the stage and trainer commands in order
(`make demo`: recipes/demo.py; re-mining with the model being trained: recipes/remine.py). Nothing in
pipelines/, vocab/ or labse_model/ imports from here."""
