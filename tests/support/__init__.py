"""Helpers shared by the tests, one module per job.

- models: tiny model configs (``tiny_config``) and a copy of a model into transformers' Llama
- data: what a data folder's token shards hold (``encoded``, ``split_tokens``)
- reports: constructed eval.json sections for the report tests
- dag: the Snakemake workflow from tests (a copy of the checkout's workflow, ``snakemake``, dry-run jobs)
- rehearsals: a config's rehearsal run once per session, Snakemake and an MLflow server in its folder
- training: token shards, a tiny pipeline config, subprocess runs and the fixtures of tests/train
- evaluation: a tokenizer, shards and run folders of tiny models; the fixtures of tests/evaluate
- analysis: a tiny trained-looking run folder for tests/analysis
- threads: torch at one intra-op thread (``one_thread``) and the autouse fixtures that set it

tests/ is on the import path through pytest's ``pythonpath`` (pyproject.toml), so a test writes
``from support.models import tiny_config``. A directory's conftest.py re-exports the fixtures
defined in its module here (``from support.training import *``).
"""
