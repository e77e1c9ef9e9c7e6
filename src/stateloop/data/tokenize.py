"""Text -> flat token shards (the data stage; ``stateloop tokenize`` is its command line): this module
encodes what the source readers (data/sources.py) read and writes the shards.

Pipeline, for a :class:`~stateloop.config.data.DataConfig`:

1. **Source** (data/sources.py): ``synthetic``, local files or a hub dataset (a local folder may
   read as one), in batches of documents; a document longer than
   :data:`~stateloop.data.sources.MAX_DOC_CHARS` is refused, naming its file and line.
2. **Held-out documents.** Unless the source names its own val/test split, a document of the
   training stream goes to ``val`` when ``u < val_fraction`` and to ``test`` when
   ``val_fraction <= u < val_fraction + test_fraction``, where ``u`` is a keyed BLAKE2b hash of
   its text mapped to [0, 1) (key: ``seed``). Hashing the *content* puts exact duplicates in the
   same split, so a held-out document never appears verbatim in training.
3. **Tokenizer.** A local ``tokenizer.json``, a hub name, or a byte-level BPE trained on the
   first ``bpe_docs`` training documents. Each document becomes ``encode(text).ids + [eos]``;
   special-token strings inside the text are encoded as plain text, so ``eos`` only ever ends a
   document.
4. **Shards.** ``{split}_{i:05d}.bin`` with ``shard_tokens`` tokens each (uint16 when the
   vocabulary fits, else uint32), the tokenizer's ``tokenizer.json``, and ``meta.json``
   (shards.py) extended with document and token counts, the tokenizer's sha256, the source's
   description and a fingerprint of the inputs. Each split's entry records where its documents
   came from (``source``: ``split:validation``, ``files:val.jsonl``, ``hash:0.0005``,
   ``synthetic``; see :func:`split_sources`).

Parallelism: ``workers`` processes encode batches of documents (synthetic documents are also
generated there, by index range); results are consumed in submission order with a bounded
number in flight, so the shards are identical for any number of workers and memory stays flat.

Atomicity: everything is written under ``DIR/.partial/`` and moved into ``DIR`` only when every
split is complete; the old ``meta.json`` is removed before anything changes and the new one is
written last. A folder with a ``meta.json`` is complete; an interrupted run leaves none (and no
shard outside ``.partial/``). A rerun whose inputs have the same fingerprint as the existing
``meta.json`` returns at once; any other rerun rewrites the folder.

Resuming: after each result that completed a shard, ``.partial/resume.json`` records (atomically,
the open shards fsynced first) the stream and the number of its results written, each writer's
complete shards (with size, mtime and inode) and open-shard token count, and the document counts.
A rerun with the same fingerprint (not ``--force``) keeps the staged tokenizer and those shards,
cuts each open shard back to its recorded tokens, reads the source up to the record without
encoding it, and goes on: the shards are the same bytes as an uninterrupted run's. Published
shards are stamped as verified (data/shards.py: ``stamp_verified``) by the writer that hashed them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from stateloop.config import to_dict
from stateloop.config.data import DataConfig, DataError, SyntheticConfig
from stateloop.data.shards import META, VERIFIED, ShardWriter, read_meta, sha256_file, stamp_verified, token_dtype, write_meta
from stateloop.data.sources import Stream, describe_source, plan_streams, split_sources, text_batches
from stateloop.data.synthetic import document
from stateloop.data.tokenizer import find_eos, load_tokenizer_spec, sha256_text, train_bpe, vocab_size_of
from stateloop.files import atomic_write_bytes, atomic_write_json, code_version

PIPELINE_VERSION = 1  # part of the fingerprint: bump when the same inputs would give other tokens
PARTIAL = ".partial"
SPLITS = ("train", "val", "test")


_W: dict = {}  # a worker's state, set by the pool initializer


def holdout_key(seed: int) -> bytes:
    """The BLAKE2b key of the held-out split assignment for a seed."""
    return seed.to_bytes(8, "little", signed=True)


def _init_worker(threads: int | None, seed: int, synthetic_cfg: dict | None, tokenizer_json: str | None = None,
                 eos_id: int = 0, dtype: str = "uint32", fractions: tuple[float, float] = (0.0, 0.0)) -> None:
    if threads is not None:  # set before `tokenizers` starts its thread pool
        os.environ["RAYON_NUM_THREADS"] = str(threads)
    _W.clear()
    _W.update(seed=seed, key=holdout_key(seed), synthetic=synthetic_cfg, fractions=fractions)
    if tokenizer_json is not None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(tokenizer_json)
        tok.encode_special_tokens = True  # "<|endoftext|>" inside a document is text, not a boundary
        _W.update(tok=tok, eos=eos_id, dtype=np.dtype(dtype))


def holdout_split(text: str, fractions: tuple[float, float], key: bytes) -> str:
    """train / val / test for one document of a hash-assigned stream (see the module docstring)."""
    h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, key=key).digest()
    u = int.from_bytes(h, "little") / 2.0**64
    val, test = fractions
    return "val" if u < val else "test" if u < val + test else "train"


def _encode(texts: list[str]) -> np.ndarray:
    tok, eos = _W["tok"], _W["eos"]
    ids: list[int] = []
    for enc in tok.encode_batch_fast(texts, add_special_tokens=False):
        ids += enc.ids
        ids.append(eos)
    return np.array(ids, dtype=_W["dtype"])


def _synthetic_docs(split: str, start: int, stop: int) -> list[str]:
    cfg = SyntheticConfig(**_W["synthetic"])
    return [document(split, i, _W["seed"], cfg) for i in range(start, stop)]


def _work(task: tuple):
    """One task. ("texts", split | None, texts) and ("synthetic", split, start, stop) return
    {split: (tokens, documents)}; ("generate", split, start, stop) returns the synthetic texts."""
    if task[0] == "generate":
        return _synthetic_docs(*task[1:])
    if task[0] == "synthetic":
        texts = _synthetic_docs(*task[1:])
        return {task[1]: (_encode(texts), len(texts))}
    _, split, texts = task
    if split is not None or not any(_W["fractions"]):
        return {split or "train": (_encode(texts), len(texts))}
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for text in texts:
        groups[holdout_split(text, _W["fractions"], _W["key"])].append(text)
    return {s: (_encode(g), len(g)) for s, g in groups.items()}


def usable_cpus() -> int:
    """The CPUs this process may use: its allocation, not the machine's count (on a cluster node,
    every core of the node). The smaller of its CPU affinity (a SLURM job's cgroup, taskset) and
    ``SLURM_CPUS_PER_TASK`` where SLURM sets it: on a cluster whose TaskPlugin is ``task/none`` the
    affinity is the whole node while the job was given only its ``--cpus-per-task``."""
    try:
        cpus = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if slurm.isdigit() and int(slurm) > 0:
        cpus = min(cpus, int(slurm))
    return cpus


def encoding_workers(workers: int, warn=None) -> int:
    """The encoding processes to start for ``data.workers`` = ``workers``: at most one per usable CPU
    (:func:`usable_cpus`); where the config asks for more, one line through ``warn`` says so (the
    output never depends on the count). 0 (encode in this process) stays 0."""
    cpus = usable_cpus()
    if workers <= cpus:
        return workers
    if warn is not None:
        slurm = os.environ.get("SLURM_CPUS_PER_TASK", "").strip()
        where = f"SLURM_CPUS_PER_TASK={slurm}" if slurm.isdigit() and int(slurm) == cpus else "its CPU affinity"
        warn(f"data.workers: {workers} encoding processes asked for, but this job may use {cpus} CPU(s) "
             f"({where}): starting {cpus} (give the tokenize job as many CPUs: resources.tokenize.cpus_per_task)")
    return cpus


def worker_threads(workers: int) -> int:
    """Threads of each encoding process's tokenizer: the allocation's CPUs shared out."""
    return max(1, usable_cpus() // max(1, workers))


class _Runner:
    """Runs :func:`_work` in order: in this process (workers=0) or a spawn pool with at most
    ``2 * workers`` tasks in flight (bounded memory; ``Pool.imap`` would read ahead without limit)."""

    def __init__(self, workers: int, *initargs):
        self.workers = workers
        if workers == 0:
            _init_worker(None, *initargs)
            self.pool = None
        else:
            import multiprocessing as mp

            # Each worker's tokenizer may use threads too; share the allocation's CPUs out between workers.
            ctx = mp.get_context("spawn")  # no inherited tokenizer thread pools or datasets threads
            self.pool = ctx.Pool(workers, _init_worker, (worker_threads(workers), *initargs))

    def map(self, tasks: Iterator[tuple]) -> Iterator[dict]:
        if self.pool is None:
            for task in tasks:
                yield _work(task)
            return
        pending: collections.deque = collections.deque()
        for task in tasks:
            pending.append(self.pool.apply_async(_work, (task,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def fingerprint(cfg: DataConfig, source: dict, tokenizer_id: dict) -> str:
    """A hash of everything the tokens depend on (not ``workers``: output never depends on it)."""
    relevant = {k: v for k, v in to_dict(cfg).items() if k not in ("workers", "synthetic", "source")}
    if relevant.get("data_files") is None:  # added later: unset, it leaves older fingerprints as they were
        relevant.pop("data_files", None)
    blob = json.dumps({"pipeline": PIPELINE_VERSION, "config": relevant, "source": source, "tokenizer": tokenizer_id},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def is_complete(out: Path, fp: str | None = None) -> bool:
    """``out`` holds a finished tokenization (with fingerprint ``fp`` when given): meta.json,
    tokenizer and every shard at its recorded size."""
    try:
        meta = read_meta(out)
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    if fp is not None and meta.get("fingerprint") != fp:
        return False
    if not (out / meta.get("tokenizer", {}).get("file", "tokenizer.json")).is_file():
        return False
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in meta.get("splits", {}).values():
        for shard in split["shards"]:
            path = out / shard["file"]
            if not path.is_file() or path.stat().st_size != shard["tokens"] * itemsize:
                return False
    return True


def _check_fit(n_vocab: int, model_vocab_size: int | None, what: str) -> None:
    if model_vocab_size is not None and n_vocab > model_vocab_size:
        fix = "lower data.vocab_size" if what == "data.vocab_size" else "choose another data.tokenizer"
        raise DataError(
            f"model.vocab_size: {model_vocab_size} is smaller than the tokenizer's vocabulary ({what}: {n_vocab} ids); "
            f"raise model.vocab_size or {fix}"
        )


def _clear(out: Path) -> None:
    """Make ``out`` look incomplete first (meta.json goes), then remove old shards and staging."""
    (out / META).unlink(missing_ok=True)
    for split in SPLITS:
        for path in out.glob(f"{split}_*.bin"):
            path.unlink()
    (out / "tokenizer.json").unlink(missing_ok=True)
    shutil.rmtree(out / PARTIAL, ignore_errors=True)
    shutil.rmtree(out / VERIFIED, ignore_errors=True)


def _synthetic_tasks(split: str, n: int, step: int = 256) -> Iterator[tuple]:
    for start in range(0, n, step):
        yield ("synthetic", split, start, min(n, start + step))


def _bpe_texts(cfg: DataConfig, stream: Stream, count: list[int]) -> Iterator[str]:
    """The first ``bpe_docs`` training documents (only documents that go to ``train``);
    ``count[0]`` counts them."""
    left = cfg.bpe_docs
    if stream.kind == "synthetic":  # generated by the workers, in order
        runner = _Runner(cfg.workers, cfg.seed, to_dict(cfg.synthetic))
        try:
            tasks = (("generate", "train", a, b) for _, _, a, b in _synthetic_tasks("train", min(left, stream.n_docs)))
            for texts in runner.map(tasks):
                count[0] += len(texts)
                yield from texts
        finally:
            runner.close()
        return
    fractions, key = cfg.holdout_fractions, holdout_key(cfg.seed)
    for batch in text_batches(stream, cfg):
        for text in batch:
            if any(fractions) and holdout_split(text, fractions, key) != "train":
                continue
            yield text
            count[0] += 1
            left -= 1
            if left == 0:
                return


def _tokenizer_identity(cfg: DataConfig, model_vocab_size: int | None) -> tuple:
    """What is known of the tokenizer before any text is read: ``(tokenizer, its JSON, its
    meta.json description, its identity for the fingerprint)``. A BPE still to be trained is
    ``(None, None, ...)``; a given tokenizer is loaded and checked (fits the model, has an eos) now."""
    if cfg.tokenizer == "bpe":
        _check_fit(cfg.vocab_size, model_vocab_size, "data.vocab_size")
        tok_desc = {"kind": "bpe", "requested_vocab_size": cfg.vocab_size}
        return None, None, tok_desc, dict(tok_desc)
    tok, tok_json, tok_desc = load_tokenizer_spec(cfg.tokenizer)
    _check_fit(vocab_size_of(tok), model_vocab_size, cfg.tokenizer)
    find_eos(tok, cfg.eos_token, cfg.tokenizer)
    return tok, tok_json, tok_desc, {**tok_desc, "sha256": sha256_text(tok_json)}


def _check_streams_have_text(cfg: DataConfig, streams: list[Stream]) -> None:
    """Read the first document of every non-synthetic stream: an empty source or an unreadable
    held-out split fails here, before the output folder is touched."""
    for stream in streams:
        if stream.kind == "synthetic":
            continue
        first = next(text_batches(dataclasses.replace(stream, n_docs=1), cfg), None)
        if not first:
            key = "data.source" if stream.split is None else f"data.{stream.split}_split"
            what = cfg.source if stream.split is None else f"{stream.hub_split or ', '.join(stream.files)}"
            raise DataError(f"{key}: {what}: no documents with text (field {cfg.text_field!r})")


def _tokenizer_from(tok_json: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tok_json)


def _write_stream(cfg: DataConfig, stream: Stream, runner: _Runner, writers: dict[str, ShardWriter],
                  docs: dict[str, int], progress: bool, skip: int = 0, save=None) -> None:
    """Encode one stream into the splits' writers, counting documents per split in ``docs``.
    ``skip``: the results of an earlier attempt (their tasks are read, not encoded); ``save(n)``
    is called after the n-th result of the stream whenever a shard was completed in it."""
    # max_tokens ends the hash-assigned stream after the first batch that reaches it:
    # results arrive in order, so the cut is the same for any number of workers.
    budget = cfg.max_tokens if stream.split is None else None
    if budget is not None and skip and writers["train"].tokens >= budget:
        return  # the earlier attempt had reached the budget
    from tqdm.auto import tqdm

    with tqdm(total=stream.n_docs, desc=f"tokenize {stream.split or 'train+held-out'}", unit="doc", unit_scale=True,
              dynamic_ncols=True, disable=not progress, file=sys.stderr, mininterval=0.5) as bar:
        n_tokens = 0
        done = skip
        tasks = _synthetic_tasks(stream.split, stream.n_docs) if stream.kind == "synthetic" else \
            (("texts", stream.split, batch) for batch in text_batches(stream, cfg))
        for result in runner.map(itertools.islice(tasks, skip, None)):
            before = sum(len(w.shards) for w in writers.values())
            for split, (arr, n_docs) in result.items():
                writers[split].add(arr)
                docs[split] += n_docs
                n_tokens += arr.size
                bar.update(n_docs)
            done += 1
            bar.set_postfix(tokens=f"{n_tokens:,}", refresh=False)
            if save is not None and sum(len(w.shards) for w in writers.values()) > before:
                save(done)
            if budget is not None and writers["train"].tokens >= budget:
                break


RESUME = "resume.json"  # in the staging folder: where an interrupted tokenization continues
RESUME_VERSION = 1


def _resume_state(out: Path, fp: str) -> dict | None:
    """The resume record of an interrupted tokenization of the same inputs in ``out``, checked
    against the staged files; None where there is none (or it no longer holds)."""
    stage = out / PARTIAL
    try:
        state = json.loads((stage / RESUME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("version") != RESUME_VERSION or state.get("fingerprint") != fp:
        return None
    try:
        tok_json = (stage / "tokenizer.json").read_text(encoding="utf-8")
        dtype = token_dtype(vocab_size_of(_tokenizer_from(tok_json)))
        for split, wstate in state["writers"].items():  # every recorded file as it was
            ShardWriter.check_state(stage, split, dtype, wstate)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def _write_shards(cfg: DataConfig, streams: list[Stream], stage: Path, tok_json: str, eos_id: int,
                  dtype: np.dtype, progress: bool, fp: str = "", tok_desc: dict | None = None,
                  resume: dict | None = None) -> tuple[dict, dict]:
    """Encode every stream into shards under ``stage``, recording after each completed shard where
    to continue (``resume.json``), or continuing from ``resume``; returns meta.json's ``splits``
    (the splits that have tokens) and each shard's largest id. Fails when no document went to ``train``."""
    if resume is None:
        writers = {s: ShardWriter(stage, s, dtype, cfg.shard_tokens) for s in SPLITS}
        docs, first, skip = dict.fromkeys(SPLITS, 0), 0, 0
    else:
        writers = {s: ShardWriter.restore(stage, s, dtype, cfg.shard_tokens, resume["writers"][s]) for s in SPLITS}
        docs, first, skip = {s: int(resume["docs"][s]) for s in SPLITS}, int(resume["stream"]), int(resume["results"])
    synth = to_dict(cfg.synthetic) if cfg.is_synthetic else None
    runner = _Runner(cfg.workers, cfg.seed, synth, tok_json, eos_id, dtype.name, cfg.holdout_fractions)
    try:
        for i, stream in enumerate(streams[first:], first):
            def save(done: int, i=i) -> None:  # the first ``done`` results of stream i are in the writers (open shards made durable first)
                atomic_write_json(stage / RESUME, {"version": RESUME_VERSION, "fingerprint": fp, "tokenizer": tok_desc or {},
                                                   "stream": i, "results": done, "docs": docs,
                                                   "writers": {s: w.state() for s, w in writers.items()}})

            _write_stream(cfg, stream, runner, writers, docs, progress, skip if i == first else 0, save)
    finally:
        runner.close()
    splits, tops = {}, {}
    origin = split_sources(cfg, streams)
    for s, w in writers.items():
        entry = w.close()
        tops.update(w.tops)
        if entry["tokens"]:
            splits[s] = {"tokens": entry["tokens"], "documents": docs[s], "source": origin.get(s, "?"),
                         "shards": entry["shards"]}
    if "train" not in splits:
        raise DataError(f"data.source: {cfg.source}: no training documents (all were empty or held out)")
    return splits, tops


def _publish(stage: Path, out: Path, splits: dict, tops: dict, vocab_size: int) -> None:
    """Move the shards and the tokenizer from ``stage`` into ``out``, stamp each shard as verified
    (its writer hashed its bytes and saw its ids: a training does not read it again), and remove
    ``stage``."""
    for entry in splits.values():
        for shard in entry["shards"]:
            os.replace(stage / shard["file"], out / shard["file"])
            stamp_verified(out / shard["file"], shard["sha256"], tops[shard["file"]], vocab_size)
    os.replace(stage / "tokenizer.json", out / "tokenizer.json")
    shutil.rmtree(stage, ignore_errors=True)


def _check_enough(cfg: DataConfig, splits: dict, least: tuple[int, str] | None, validation: str | None = None) -> None:
    """The train split of ``splits`` (meta.json's), and the split ``validation`` that a training
    validates on where given, refused (one line naming the source, or the split) where shorter than
    ``least`` = (tokens, what needs that many); an empty held-out split is absent, so 0 tokens."""
    if least is None:
        return
    tokens = splits["train"]["tokens"]
    if tokens < least[0]:
        raise DataError(f"data.source: {cfg.source}: {tokens} training tokens, fewer than {least[1]}: "
                        f"nothing to train on; give a larger corpus")
    if validation is None or validation == "train":
        return
    entry = splits.get(validation, {})
    if entry.get("tokens", 0) < least[0]:
        raise DataError(f"data: split {validation!r} ({entry.get('source', cfg.source)}) has {entry.get('tokens', 0)} tokens, "
                        f"fewer than {least[1]}: validation (train.val_split) would have nothing to read; give the "
                        f"split more text")


def tokenize(cfg: DataConfig, out: str | Path, *, model_vocab_size: int | None = None, force: bool = False,
             progress: bool = True, log=print, least: tuple[int, str] | None = None, validation: str | None = None) -> dict:
    """Tokenize ``cfg``'s source into the folder ``out``; returns its meta.json content. A missing
    or empty source, an unreadable tokenizer, one with more ids than ``model_vocab_size``, or a
    train split (or the split ``validation`` that training validates on) shorter than ``least`` =
    (tokens, what needs them) is a one-line :class:`DataError` (no shards left behind). ``workers >
    0`` spawns a pool: a script needs the ``__main__`` guard."""
    out = Path(out)
    streams = plan_streams(cfg)
    source = describe_source(cfg, streams)
    # Tokenizer identity first (cheap), so that an up-to-date folder is recognised without work.
    tok, tok_json, tok_desc, tok_id = _tokenizer_identity(cfg, model_vocab_size)
    fp = fingerprint(cfg, source, tok_id)
    if not force and is_complete(out, fp):
        meta = read_meta(out)
        _check_fit(meta["vocab_size"], model_vocab_size, str(out / "tokenizer.json"))
        _check_enough(cfg, meta["splits"], least, validation)
        log(f"{out}: up to date ({meta['tokens']:,} tokens); nothing to do")
        return meta

    _check_streams_have_text(cfg, streams)
    workers = encoding_workers(cfg.workers, warn=lambda msg: print(f"stateloop tokenize: warning: {msg}", file=sys.stderr))
    if workers != cfg.workers:
        cfg = dataclasses.replace(cfg, workers=workers)  # not part of the fingerprint: the same tokens
    resume = None if force else _resume_state(out, fp)
    stage = out / PARTIAL
    if resume is not None:  # an interrupted run of the same inputs: its tokenizer and complete shards stay
        tok_json = (stage / "tokenizer.json").read_text(encoding="utf-8")
        tok, tok_desc = _tokenizer_from(tok_json), resume["tokenizer"]
        done = sum(len(w["shards"]) for w in resume["writers"].values())
        log(f"{out}: resuming an interrupted tokenization after its last complete shard ({done} shards kept)")
    else:
        out.mkdir(parents=True, exist_ok=True)
        _clear(out)
        stage.mkdir()
        if tok is None:  # a byte-level BPE trained on the first training documents
            log(f"training a byte-level BPE ({cfg.vocab_size} ids) on up to {cfg.bpe_docs:,} training documents")
            count = [0]
            tok = train_bpe(_bpe_texts(cfg, streams[0], count), cfg.vocab_size, cfg.eos_token or "<|endoftext|>")
            tok_json, tok_desc = tok.to_str(), {**tok_desc, "trained_on_docs": count[0]}
        atomic_write_bytes(stage / "tokenizer.json", tok_json.encode("utf-8"))
    eos_token, eos_id = find_eos(tok, cfg.eos_token, tok_desc.get("name", "the trained BPE"))
    n_vocab = vocab_size_of(tok)
    _check_fit(n_vocab, model_vocab_size, cfg.tokenizer)
    dtype = token_dtype(n_vocab)

    splits, tops = _write_shards(cfg, streams, stage, tok_json, eos_id, dtype, progress, fp, tok_desc, resume)
    try:
        _check_enough(cfg, splits, least, validation)
    except DataError:
        shutil.rmtree(stage, ignore_errors=True)  # no shards of it stay; what the folder held before was cleared already
        with contextlib.suppress(OSError):
            out.rmdir()  # only where empty
        raise
    _publish(stage, out, splits, tops, n_vocab)  # meta.json last: only a complete folder has one
    write_meta(out, {"dtype": dtype.name, "vocab_size": n_vocab, "eos_id": eos_id, "eos_token": eos_token,
                     "tokens": sum(e["tokens"] for e in splits.values()),
                     "documents": sum(e["documents"] for e in splits.values()),
                     "tokenizer": {"file": "tokenizer.json", "sha256": sha256_file(out / "tokenizer.json"), **tok_desc},
                     "source": source, "splits": splits, "fingerprint": fp, "data_config": to_dict(cfg),
                     "code_version": code_version()})
    log(f"{out}: " + ", ".join(f"{s} {e['tokens']:,} tokens / {e['documents']:,} docs" for s, e in splits.items())
        + f" ({dtype.name}, vocab {n_vocab})")
    return read_meta(out)
