"""The ``data:`` section of a scale: where the text comes from, how it is tokenized, how it is
cut into train / val / test token shards. Read strictly by :func:`stateloop.config.from_dict`
(unknown keys and wrong types are one-line errors naming the key).

    scales:
      tiny:
        data:
          source: synthetic                 # the project's generator (stateloop.data.synthetic)
          tokenizer: bpe                    # byte-level BPE trained on the train split
          vocab_size: 2048
          synthetic: {train_docs: 20000, val_docs: 500, test_docs: 500}
      1.4b:
        data:
          source: monology/pile-uncopyrighted   # a `datasets` hub name (or a local copy of it)
          data_files: {train: train/*.jsonl.zst, validation: val.jsonl.zst}
          split: train
          val_split: validation                 # the Pile's own validation documents
          val_fraction: 0.0
          max_tokens: 30000000000               # the paper's token budget: no need to read more
          tokenizer: EleutherAI/gpt-neox-20b    # hub name, or a local tokenizer.json
          workers: 32
      gpu:
        data:
          source: HuggingFaceFW/fineweb-edu     # one split only (configs/gpu.yaml) ...
          val_fraction: 0.001                   # ... so val is held out by content hash

``source`` is ``"synthetic"``, a hub dataset name (with ``hub_config`` and ``split``), or local
files: a path, a directory, or a glob (or a list of them) of ``.json``/``.jsonl``, ``.txt`` or
``.parquet`` files. A value that names an existing path, contains a glob character or ends in
one of those extensions is local; anything else is a hub name.

Held-out splits. ``val_split`` / ``test_split`` take a split of the source whole:

- hub source: a split name, read as ``datasets.load_dataset(source, hub_config, split=...)``;
  ``data_files`` (split name -> path patterns) names each split's files where ``datasets`` would
  not find them (the Pile's layout gives a ``train`` split only);
- ``data_files`` with one local folder as ``source``: the folder is read as a hub repository is,
  so a local mirror takes the same ``data:`` section with only ``source`` changed;
- other local sources: ``val_split`` / ``test_split`` name files (paths or globs).

Without ``val_split``, ``val_fraction`` of the training documents are held out by a hash of their
content (and likewise ``test_fraction``). :attr:`DataConfig.val_description` says which, in words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from stateloop.config import ConfigError, Float, Int, Text, section

LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".txt": "text", ".text": "text", ".parquet": "parquet"}


def is_local_source(item: str) -> bool:
    """A ``data.source`` entry naming local files (a path, folder, glob or file of a local format)
    rather than a hub dataset or ``synthetic``."""
    return (
        Path(item).exists()
        or any(ch in item for ch in "*?[")
        or item.endswith(tuple(LOCAL_FORMATS))
        or item.startswith((".", "/", "~"))
    )


SYNTHETIC_KINDS = ("bindings", "arithmetic", "facts", "lists")


class DataError(ConfigError):
    """The data source or tokenizer cannot be used. One line, naming the file or key."""


@section(key="data.synthetic")
class SyntheticConfig:
    """Settings of the offline generator (:mod:`stateloop.data.synthetic`). Each split is drawn
    from its own seed namespace, so held-out documents never come from the training stream."""

    train_docs: Int = Field(20000, gt=0, description="documents of the train split")
    val_docs: Int = Field(500, ge=0, description="... of the val split")
    test_docs: Int = Field(500, ge=0, description="... of the test split")
    mix: dict[Text, Float] = Field(default_factory=lambda: {k: 1.0 for k in SYNTHETIC_KINDS}, description="Relative weight of each episode "
        "kind in a document (see the generator's docstring).")
    max_hops: Int = Field(4, ge=1, le=7, description="longest chain of variable bindings / relations to follow")
    max_steps: Int = Field(6, ge=1, le=12, description="longest chain of arithmetic statements")

    def __post_init__(self) -> None:
        for key in self.mix:
            if key not in SYNTHETIC_KINDS:
                raise ConfigError(f"synthetic.mix.{key}: unknown kind (known: {', '.join(SYNTHETIC_KINDS)})")
            if self.mix[key] < 0:
                raise ConfigError(f"synthetic.mix.{key}: weight must be >= 0, got {self.mix[key]}")
        if not any(w > 0 for w in self.mix.values()):
            raise ConfigError("synthetic.mix: at least one kind needs a positive weight")


@section(key="data")
class DataConfig:
    """Where a scale's tokens come from. Output: one folder of token shards (see shards.py)."""

    source: Text | list[Text] = Field("synthetic", description="\"synthetic\" | hub dataset name | local paths/globs")
    hub_config: Text | None = Field(None, description="the hub dataset's config name (e.g. \"wikitext-103-raw-v1\")")
    split: Text = Field("train", description="hub split read for training (local files: all rows)")
    val_split: Text | None = Field(None, description="hub split used whole as \"val\" (else val_fraction of `split`)")
    test_split: Text | None = Field(None, description="hub split used whole as \"test\" (else test_fraction of `split`)")
    data_files: dict[Text, Text | list[Text]] | None = Field(None, description="split name -> file pattern(s) relative to the source (hub "
        "repo or one local folder), passed to datasets.load_dataset as data_files; None: the splits datasets infers from file names")
    val_fraction: Float = Field(0.0005, ge=0, lt=1, description="documents of `split` held out as \"val\", chosen by content hash")
    test_fraction: Float = Field(0.0, ge=0, lt=1, description="... and as \"test\"")
    text_field: Text = Field("text", description="column holding the document text (json / parquet / hub)")
    text_unit: Literal["document", "paragraph", "line"] = Field("document", description=".txt files: one document per \"document\" (file), "
        "\"paragraph\" or \"line\"")
    max_docs: Int | None = Field(None, gt=0, description="read at most this many documents of `split` (None: all)")
    max_tokens: Int | None = Field(None, gt=0, description="stop reading `split` once train has this many tokens (None: all)")
    tokenizer: Text = Field("bpe", description="\"bpe\" (train on the corpus) | path to tokenizer.json | hub name")
    vocab_size: Int = Field(4096, ge=257, description="BPE only: size of the trained vocabulary, special tokens included")
    bpe_docs: Int = Field(100000, gt=0, description="BPE only: train on the first this-many training documents")
    eos_token: Text | None = Field(None, description="end-of-document token (None: the tokenizer's own, detected)")
    shard_tokens: Int = Field(1 << 27, gt=0, description="tokens per shard file (2^27 = 256 MiB at uint16)")
    workers: Int = Field(1, ge=0, description="encoding processes (0: encode in the main process); output never depends on it")
    seed: Int = Field(0, description="seeds the synthetic generator and the held-out hash")
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig, description="the generator's sizes (source: synthetic)")

    @property
    def val_description(self) -> str:
        """Where the "val" split comes from, in words for table notes: e.g. "the source's own
        'validation' split" or "0.05% of the training documents, held out by content hash"."""
        return self._heldout_description("val")

    def _heldout_description(self, which: str) -> str:
        if self.is_synthetic:
            n = getattr(self.synthetic, f"{which}_docs")
            return f"{n:,} documents of the synthetic generator's own {which} split" if n else f"no {which} split"
        named = getattr(self, f"{which}_split")
        if named:
            if self.data_files is not None or not self._local_source:
                return f"the source's own {named!r} split"
            return f"the held-out files {named}"
        fraction = getattr(self, f"{which}_fraction")
        if not fraction:
            return f"no {which} split"
        return f"{100 * fraction:g}% of the training documents, held out by content hash"

    @property
    def _local_source(self) -> bool:
        items = self.source if isinstance(self.source, list) else [self.source]
        return all(is_local_source(item) for item in items)

    @property
    def holdout_fractions(self) -> tuple[float, float]:
        """(val, test) fractions held out of the hash-split stream; 0 for a split taken whole
        from the hub (val_split / test_split)."""
        return (0.0 if self.val_split else self.val_fraction, 0.0 if self.test_split else self.test_fraction)

    def __post_init__(self) -> None:
        if isinstance(self.source, list):
            if not self.source:
                raise ConfigError("data.source: empty list of files")
            if "synthetic" in self.source:
                raise ConfigError("data.source: 'synthetic' cannot be combined with files")
        elif not self.source:
            raise ConfigError("data.source: must not be empty")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ConfigError("data.val_fraction: val_fraction + test_fraction must be below 1")
        if self.data_files is not None:
            if not self.data_files:
                raise ConfigError("data.data_files: empty mapping (name at least the training split's files)")
            for name, patterns in self.data_files.items():
                if not patterns or (isinstance(patterns, list) and not all(patterns)):
                    raise ConfigError(f"data.data_files.{name}: empty file pattern")
            for key in ("split", "val_split", "test_split"):
                name = getattr(self, key)
                if name is not None and name not in self.data_files:
                    raise ConfigError(f"data.{key}: {name!r} is not a split of data.data_files "
                                      f"(has: {', '.join(self.data_files)})")
        if not self.tokenizer:
            raise ConfigError("data.tokenizer: must not be empty")

    @property
    def is_synthetic(self) -> bool:
        return self.source == "synthetic"

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits the data stage (``stateloop tokenize``) makes, in the order train, val, test.

        train always; the synthetic generator makes each split whose ``synthetic.*_docs`` count is
        positive; other sources make val when ``val_split`` is set or ``val_fraction`` > 0, and test
        when ``test_split`` is set or ``test_fraction`` > 0 (data/tokenize.py). A hash-held-out
        split of a tiny corpus can still come out empty, and is then absent.
        """
        if self.is_synthetic:
            s = self.synthetic
            counts = {"train": s.train_docs, "val": s.val_docs, "test": s.test_docs}
            return tuple(name for name, n in counts.items() if n > 0)
        out = ["train"]
        if self.val_split or self.val_fraction > 0:
            out.append("val")
        if self.test_split or self.test_fraction > 0:
            out.append("test")
        return tuple(out)
