"""Tokenizers: a local ``tokenizer.json``, a hub name, or a byte-level BPE trained on the corpus.

Every data folder carries the exact ``tokenizer.json`` that made its tokens (its sha256 is in
``meta.json``); training and evaluation open it with :func:`load_tokenizer`, never by name.
Everything here uses the ``tokenizers`` library (imported inside functions, so that importing
this module stays cheap).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from stateloop.config import ConfigError
from stateloop.config.data import DataError
from stateloop.data.shards import read_meta, sha256_file

EOS = "<|endoftext|>"  # the end-of-document token of a trained BPE (GPT-2 / GPT-NeoX spelling)
# Tried in order when a tokenizer's end-of-document token is not given.
EOS_CANDIDATES = (EOS, "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
TOKENIZER_FILE = "tokenizer.json"


def is_local_tokenizer(spec: str) -> bool:
    return spec.endswith(".json") or Path(spec).exists()


def load_tokenizer_spec(spec: str):
    """A tokenizer from a local tokenizer.json (or a folder holding one) or a hub name.

    Returns ``(tokenizer, json_text, description)``; ``json_text`` is what gets copied into the
    data folder: the file's own bytes for a local file, the serialised tokenizer otherwise.
    """
    from tokenizers import Tokenizer

    if is_local_tokenizer(spec):
        path = Path(spec)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        if not path.is_file():
            raise DataError(f"data.tokenizer: {path}: file not found")
        text = path.read_text(encoding="utf-8")
        try:
            tok = Tokenizer.from_str(text)
        except Exception as err:  # tokenizers raises plain Exception subclasses
            raise DataError(f"data.tokenizer: {path}: not a tokenizers JSON file ({str(err).splitlines()[0]})") from None
        return tok, text, {"kind": "file", "name": str(path.resolve())}
    from huggingface_hub import hf_hub_download

    try:  # through huggingface_hub's cache: offline (HF_HUB_OFFLINE=1) the file `stateloop prefetch` put there
        path = hf_hub_download(spec, TOKENIZER_FILE)
        tok = Tokenizer.from_file(path)
    except Exception as err:
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise DataError(f"data.tokenizer: cannot load {spec!r} from the hub ({type(err).__name__}: {first})") from None
    return tok, tok.to_str(), {"kind": "hub", "name": spec}


def train_bpe(texts: Iterable[str], vocab_size: int, eos_token: str = EOS):
    """A byte-level BPE (GPT-2 style: bytes mapped to printable symbols, GPT-2 pre-split regex,
    no normalisation, so ``decode(encode(x)) == x`` for every string) with ``vocab_size`` ids,
    the 256 byte symbols and ``eos_token`` included. Deterministic for equal inputs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def find_eos(tok, eos_token: str | None, where: str = "tokenizer") -> tuple[str, int]:
    """The end-of-document token and its id: ``eos_token`` if given, else the first of
    :data:`EOS_CANDIDATES` the vocabulary has."""
    if eos_token is not None:
        idx = tok.token_to_id(eos_token)
        if idx is None:
            raise DataError(f"data.eos_token: {eos_token!r} is not in the vocabulary of {where}")
        return eos_token, idx
    for cand in EOS_CANDIDATES:
        idx = tok.token_to_id(cand)
        if idx is not None:
            return cand, idx
    raise DataError(f"data.eos_token: {where} has none of {', '.join(EOS_CANDIDATES)}; name its end-of-document token")


def vocab_size_of(tok) -> int:
    """Number of ids the tokenizer can emit (added tokens included): ids are 0..n-1."""
    return tok.get_vocab_size(with_added_tokens=True)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_file(data_dir: str | Path, meta: dict) -> Path:
    """The tokenizer file of a data folder: meta.json's ``tokenizer.file`` (default tokenizer.json),
    a file name inside the folder like the shards' names (a path out of it is refused in one line,
    naming meta.json). Whether the file exists is the caller's question."""
    where = Path(data_dir) / "meta.json"
    entry = meta.get("tokenizer", {})
    if not isinstance(entry, dict):
        raise DataError(f"{where}: 'tokenizer' is not an object (an incomplete or foreign meta.json; rerun `stateloop tokenize`)")
    name = entry.get("file", TOKENIZER_FILE)
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise DataError(f"{where}: tokenizer file {name!r} is not a file name inside the data folder")
    return Path(data_dir) / name


def meta_eos_id(data_dir: str | Path) -> int:
    """The end-of-document id in a data folder's meta.json; a one-line ConfigError where it has no integer one."""
    try:
        return int(read_meta(data_dir)["eos_id"])  # FileNotFoundError naming meta.json
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{Path(data_dir) / 'meta.json'}: no integer eos_id") from None


def load_tokenizer(data_dir: str | Path):
    """The tokenizer that made a data folder's tokens (a ``tokenizers.Tokenizer``).

    Checks the file against the sha256 recorded in ``meta.json``, so a model is never scored
    with a tokenizer other than the one it was trained on. The end-of-document id is
    ``read_meta(data_dir)["eos_id"]``. Documents in the shards are
    ``encode(text, add_special_tokens=False).ids + [eos_id]``, with a special-token string
    inside a text encoded as plain text; the returned tokenizer has ``encode_special_tokens``
    switched on to match, so ``encode(text, add_special_tokens=False)`` tokenizes evaluation
    text exactly as the training data was.
    """
    from tokenizers import Tokenizer

    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    path = tokenizer_file(data_dir, meta)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the data folder's tokenizer is missing")
    want = meta.get("tokenizer", {}).get("sha256")
    if want and sha256_file(path) != want:
        raise DataError(f"{path}: sha256 differs from meta.json (the tokenizer was changed after tokenization)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises plain Exception subclasses
        raise DataError(f"{path}: not a tokenizers JSON file ({str(err).splitlines()[0]})") from None
    tok.encode_special_tokens = True
    return tok
