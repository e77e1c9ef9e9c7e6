"""What sealing a checkpoint with its sha256 costs, side by side in one run.

Three ways to write the same checkpoint (a dict of float32 tensors of --mb megabytes) into the
run folder, interleaved over --repeats:

  fabric-default   Lightning's TorchCheckpointIO (serialise into memory, temporary file in
                   $TMPDIR, move), then read the file back to hash it (the project before)
  write+rehash     straight to the file, then read it back to hash it
  hash-on-write    straight to the file, hashing the bytes as they go (the project now:
                   stateloop.train.checkpoint.direct_checkpoint_io)

It prints the median seconds of each, their ratio to hash-on-write, sha256's own throughput on
this CPU, and what that means at the paper's 1.4B size (fp32 weights + two AdamW moments, from
`stateloop params --config configs/paper.yaml`'s largest run, counted on the meta device).

    python benchmarks/checkpoint_hash.py --mb 512 --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from stateloop.data.shards import sha256_file
from stateloop.train.checkpoint import direct_checkpoint_io


def largest_paper_params() -> int:
    from stateloop.experiments import expand_runs, load_pipeline
    from stateloop.models.registry import build_model

    root = Path(__file__).resolve().parents[1]
    runs = [r for r in expand_runs(load_pipeline(root / "configs/paper.yaml")) if r.model == "stateloop"]
    biggest = max(runs, key=lambda r: r.model_config.d_model)
    return sum(p.numel() for p in build_model(biggest.model_config, device="meta").parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    n = args.mb * (1 << 20) // 4 // 8
    state = {"model": {f"w{i}": torch.randn(n) for i in range(8)}, "step": 1}
    folder = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir="."))
    direct, fabric_io = direct_checkpoint_io(), TorchCheckpointIO()

    def fabric_default(path):
        fabric_io.save_checkpoint(state, path)
        return sha256_file(path)

    def write_rehash(path):
        direct.save_checkpoint(state, path)
        direct.written.clear()
        return sha256_file(path)

    def hash_on_write(path):
        direct.save_checkpoint(state, path)
        return direct.written.pop(str(path))[0]

    methods = {"fabric-default": fabric_default, "write+rehash": write_rehash, "hash-on-write": hash_on_write}
    times: dict[str, list[float]] = {m: [] for m in methods}
    digests = set()
    for r in range(args.repeats):
        for name, fn in methods.items():
            path = folder / f"{name}.ckpt"
            t = time.perf_counter()
            digests.add(fn(path))
            times[name].append(time.perf_counter() - t)
            path.unlink()
    assert len(digests) == 1, "the three ways must write the same bytes"

    blob = bytes(256 << 20)
    t = time.perf_counter()
    hashlib.sha256(blob).hexdigest()
    sha_gbs = (256 / 1024) / (time.perf_counter() - t)

    base = statistics.median(times["hash-on-write"])
    print(f"checkpoint of {args.mb} MB, median of {args.repeats}:")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:15s} {med:7.2f} s   {med / base:5.2f}x hash-on-write")
    params = largest_paper_params()
    gb = params * 12 / 1e9  # fp32 weights + AdamW exp_avg + exp_avg_sq
    print(f"sha256 on this CPU: {sha_gbs:.2f} GB/s")
    print(f"paper's largest StateLoop: {params / 1e9:.2f}B parameters -> ~{gb:.1f} GB checkpoint; "
          f"hashing it: ~{gb / sha_gbs:.0f} s per save (while writing), ~{gb / sha_gbs:.0f} s more per resume (verify)")
    folder.rmdir()


if __name__ == "__main__":
    main()
