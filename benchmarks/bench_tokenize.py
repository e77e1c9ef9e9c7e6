"""Tokenization throughput: ``stateloop tokenize`` against the tokenizer's own ``encode_batch``.

    python benchmarks/bench_tokenize.py                     # ~24 MB of text, GPT-NeoX tokenizer
    python benchmarks/bench_tokenize.py --mb 8 --repeats 1  # quicker
    python benchmarks/bench_tokenize.py --memory            # also: peak memory at 1x and 4x corpus

The corpus is a local ``.jsonl`` (tinyshakespeare paragraphs, repeated to size, from the shared
data folder; the synthetic corpus when that is absent). Measured side by side in one run, each
repeat interleaving the methods, median reported:

- ``encode_batch``: every document already in memory, ``tok.encode_batch(batch)`` over batches
  of 1024 documents and ``.ids`` read from each result (the tokenizer's own Rust thread pool,
  all cores), in this process. This is the reference (ratio 1.0).
- ``encode_batch 1 thread``: the same in a subprocess with ``RAYON_NUM_THREADS=1``.
- ``tokenize workers=W``: the whole stage, end to end: reading the .jsonl, held-out hashing,
  encoding, writing and checksumming shards, meta.json, and the worker pool's start-up. Tokens
  counted the same way (one end-of-document token per document).

Best-of-N is the figure to compare on a shared machine (other jobs only ever slow a run down);
the median is printed beside it. Ratios are against ``encode_batch`` of the same statistic.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
SHARED = Path(os.environ.get("STATELOOP_SHARED", ROOT.parent / "shared")) / "data"


def make_corpus(path: Path, mb: float) -> int:
    """Write ~mb MB of documents to path (.jsonl); returns the number of documents."""
    src = SHARED / "tinyshakespeare" / "input.txt"
    if src.is_file():
        paras = [p for p in src.read_text().split("\n\n") if p.strip()]
    else:
        from stateloop.data.synthetic import iter_documents

        paras = list(iter_documents("train", 5000))
    n, size = 0, 0
    with open(path, "w") as fh:
        while size < mb * 1e6:
            for i in range(0, len(paras), 3):  # documents of three paragraphs
                line = json.dumps({"text": "\n\n".join(paras[i : i + 3])}) + "\n"
                fh.write(line)
                size += len(line)
                n += 1
    return n


def baseline(tokenizer_path: str, corpus: Path) -> tuple[float, int]:
    """Seconds and tokens (ids + one eos per document) of encode_batch over the in-memory corpus."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    texts = [json.loads(line)["text"] for line in open(corpus)]
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(texts), 1024):
        for enc in tok.encode_batch(texts[i : i + 1024], add_special_tokens=False):
            n += len(enc.ids) + 1
    return time.perf_counter() - t0, n


def ours(tokenizer_path: str, corpus: Path, out: Path, workers: int) -> tuple[float, int]:
    from stateloop.config.data import DataConfig
    from stateloop.data.tokenize import tokenize

    cfg = DataConfig(source=str(corpus), tokenizer=tokenizer_path, workers=workers)
    t0 = time.perf_counter()
    meta = tokenize(cfg, out, force=True, progress=False, log=lambda *a: None)
    return time.perf_counter() - t0, meta["tokens"]


def inner() -> None:
    """Subprocess entry: one measurement, printed as JSON."""
    mode, tok, corpus = sys.argv[2:5]
    if mode == "baseline":
        dt, n = baseline(tok, Path(corpus))
    else:
        dt, n = ours(tok, Path(corpus), Path(sys.argv[5]), int(sys.argv[6]))
    rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({"seconds": dt, "tokens": n, "max_rss_mb": rss / 1024}))


def subprocess_run(args: list[str], env: dict | None = None) -> dict:
    r = subprocess.run([sys.executable, __file__, "--inner", *args], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    if r.returncode:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=24.0, help="corpus size in MB of JSON lines")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--tokenizer", default=str(SHARED / "gpt-neox-20b" / "tokenizer.json"))
    p.add_argument("--memory", action="store_true", help="also peak RSS of tokenize at 1x and 4x the corpus")
    args = p.parse_args()
    if not Path(args.tokenizer).is_file():
        sys.exit(f"{args.tokenizer}: tokenizer not found (pass --tokenizer PATH/tokenizer.json)")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.jsonl"
        n_docs = make_corpus(corpus, args.mb)
        print(f"corpus: {corpus.stat().st_size / 1e6:.1f} MB, {n_docs:,} documents; tokenizer {args.tokenizer}; "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        methods = {"encode_batch": lambda: baseline(args.tokenizer, corpus)}
        methods["encode_batch 1 thread"] = lambda: (lambda r: (r["seconds"], r["tokens"]))(
            subprocess_run(["baseline", args.tokenizer, str(corpus)], {"RAYON_NUM_THREADS": "1"}))
        for w in args.workers:
            methods[f"tokenize workers={w}"] = lambda w=w: ours(args.tokenizer, corpus, tmp / f"out{w}", w)
        times: dict[str, list[float]] = {m: [] for m in methods}
        tokens: dict[str, int] = {}
        for r in range(args.repeats):
            for name, fn in methods.items():
                dt, n = fn()
                times[name].append(dt)
                tokens[name] = n
        assert len(set(tokens.values())) == 1, f"token counts differ: {tokens}"
        n = tokens["encode_batch"]
        print(f"{n:,} tokens; {args.repeats} interleaved repeats; load average now {os.getloadavg()[0]:.1f}")
        print(f"{'':<26}{'best of ' + str(args.repeats):>27}{'median':>27}")
        print(f"{'method':<26}" + f"{'seconds':>9}{'Mtok/s':>9}{'ratio':>9}" * 2)
        best_ref, med_ref = min(times["encode_batch"]), statistics.median(times["encode_batch"])
        for name, ts in times.items():
            b, m = min(ts), statistics.median(ts)
            print(f"{name:<26}{b:>9.2f}{n / b / 1e6:>9.3f}{best_ref / b:>9.2f}{m:>9.2f}{n / m / 1e6:>9.3f}{med_ref / m:>9.2f}")

        if args.memory:
            big = tmp / "big.jsonl"
            with open(big, "w") as fh:
                for _ in range(4):
                    fh.write(corpus.read_text())
            for label, path in (("1x", corpus), ("4x", big)):
                for w in args.workers:
                    r = subprocess_run(["ours", args.tokenizer, str(path), str(tmp / f"mem{w}"), str(w)])
                    print(f"peak RSS, tokenize {label} corpus ({r['tokens']:,} tokens), workers={w}: "
                          f"{r['max_rss_mb']:.0f} MB (largest single process)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inner":
        inner()
    else:
        main()
