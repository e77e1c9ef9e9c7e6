"""Bad input gets one clear line, before any work: each case through the command a
user types, exit status 2, one line naming the key, value or file, and no output folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stateloop.cli import main
from support.training import write_config, write_shards

RUN = "t/stateloop/K2_ds32_seed1234"


def _train(cfg, data, out, run=RUN, *overrides):
    return ["train", "--config", str(cfg), run, "--data-dir", str(data), "--out", str(out), "--set", *overrides]


def _tokenize_config(tmp_path, text_file, train=""):
    path = tmp_path / "text.yaml"
    path.write_text(f"""
scales:
  s:
    data: {{source: {text_file}, tokenizer: bpe, vocab_size: 300, val_split: {text_file}, test_split: {text_file}}}
    train: {{{train}}}
    model: {{vocab_size: 512, n_layers: 1, d_model: 32, d_ff: 64, n_heads: 2, head_dim: 16, max_seq_len: 64}}
experiments:
  table1: {{scale: s, models: [stateloop], K: [2], d_s: [32]}}
""")
    return path


def _case(name, tmp_path):
    """(argv, text the one line must hold) of each case; the output folder is tmp_path/out."""
    cfg, data, out = write_config(tmp_path / "cfg.yaml"), tmp_path / "data", tmp_path / "out"
    if name == "yaml":
        (tmp_path / "broken.yaml").write_text("scales: {t: [1, 2\n")
        return _train(tmp_path / "broken.yaml", data, out), "broken.yaml: not valid YAML"
    if name in ("meta-not-json", "meta-not-object"):
        data.mkdir()
        (data / "meta.json").write_text('{"dtype": ' if name == "meta-not-json" else json.dumps([1, 2]))
        needle = "meta.json: not valid JSON" if name == "meta-not-json" else "meta.json: expected a JSON object, got list"
        return _train(cfg, data, out), needle
    if name == "missing-shared-data":  # a user's clone without ../shared: the offline text is not there
        missing = tmp_path / "shared" / "data" / "tiny-shakespeare" / "input.txt"
        return ["tokenize", "--config", str(_tokenize_config(tmp_path, missing)), "--scale", "s", "--out", str(out),
                "--no-progress"], f"data.source: {missing}: file not found"
    if name in ("not-utf8", "empty-text"):
        text = tmp_path / "text.txt"
        text.write_bytes(b"caf\xe9 au lait\n" if name == "not-utf8" else b"")
        needle = "text.txt: not UTF-8 text (invalid continuation byte: byte 0xe9)" if name == "not-utf8" else "text.txt: file is empty"
        return ["tokenize", "--config", str(_tokenize_config(tmp_path, text)), "--scale", "s", "--out", str(out),
                "--no-progress"], needle
    if name in ("whitespace-corpus", "three-words"):  # warned about, exit 0; only training refused it
        text = tmp_path / "text.txt"
        text.write_text(" \n\n  \t \n" if name == "whitespace-corpus" else "three words here\n")
        return (["tokenize", "--config", str(_tokenize_config(tmp_path, text)), "--scale", "s", "--out", str(out), "--no-progress"],
                f"data.source: {text}: {7 if name == 'whitespace-corpus' else 16} training tokens, fewer than one training window "
                f"of train.seq_len + 1 = 2049 (scales.s.train): nothing to train on; give a larger corpus")
    if name == "val-split-shorter-than-window":  # issue 60: tokenized with exit 0, refused only by training
        text, val = tmp_path / "text.txt", tmp_path / "val.txt"
        text.write_text("".join(f"line {i} of the training text, long enough to train on\n" for i in range(40)))
        val.write_text("a few words\n")
        cfg = _tokenize_config(tmp_path, text, "seq_len: 32, val_tokens: 64")
        cfg.write_text(cfg.read_text().replace(f"val_split: {text}", f"val_split: {val}"))
        return (["tokenize", "--config", str(cfg), "--scale", "s", "--out", str(out), "--no-progress"],
                "data: split 'val' (files:val.txt) has 13 tokens, fewer than one training window of train.seq_len + 1 = 33 "
                "(scales.s.train): validation (train.val_split) would have nothing to read; give the split more text")
    if name in ("long-line", "long-document"):  # a 60 MB line took 4.9 GB and 14+ minutes to tokenize
        from stateloop.data.sources import MAX_DOC_CHARS

        text = tmp_path / "text.txt"
        text.write_text("a short first line\n" + "x" * (MAX_DOC_CHARS + 1) + "\n")
        unit = ["--set", "data.text_unit=line"] if name == "long-line" else []
        where = "text.txt:2: a document longer than 8,388,608 characters" if name == "long-line" else (
            "text.txt: a document longer than 8,388,608 characters (memory per document is bounded); split it "
            "(data.text_unit: document reads the whole file as one")
        return ["tokenize", "--config", str(_tokenize_config(tmp_path, text)), "--scale", "s", "--out", str(out),
                "--no-progress", *unit], where
    if name == "bench-tokens-negative":
        import yaml

        raw = yaml.safe_load(cfg.read_text())
        cfg.write_text(yaml.safe_dump({**raw, "bench": {"tokens": -1}}))
        return ["plan", "--config", str(cfg)], "bench.tokens: must be positive, got -1"
    if name == "scale-without-model":  # issue 60: the default model (d = 2048) ran 82 s into an allocation failure
        import yaml

        raw = yaml.safe_load(cfg.read_text())
        del raw["scales"]["t"]["model"]
        cfg.write_text(yaml.safe_dump(raw))
        return _train(cfg, data, out), ("cfg.yaml: scales.t.model: missing section (experiments.e runs on it); without it "
                                        "every model takes the default shape, d_model 2048 and 24 layers (the 1.4B's): state "
                                        "vocab_size, n_layers, d_model, d_ff, n_heads, head_dim and max_seq_len")
    if name == "bench-prefill-beyond-context":
        return (["bench", "decode", "--config", str(cfg), "--scale", "t", "--models", "vanilla_looped:2", "--prefill", "65",
                 "--tokens", "2", "--device", "cpu", "--out", str(out / "decode.json"), "--no-progress"],
                "--prefill 65: longer than the context of vanilla_looped:K2 (model.max_seq_len = 64)")
    write_shards(data, n_train=20 if name == "seq-longer-than-data" else 4000, n_val=400)
    if name in ("shard-twice", "val-shard-in-train", "val-shard-copies-train"):  # the outside probe: trained without a word
        meta = json.loads((data / "meta.json").read_text())
        splits = meta["splits"]
        if name == "val-shard-copies-train":  # issue 60: a byte-identical copy of a training shard under the val split's name
            (data / "val_00000.bin").write_bytes((data / "train_00000.bin").read_bytes())
            splits["val"] = {"tokens": splits["train"]["tokens"],
                             "shards": [{**splits["train"]["shards"][0], "file": "val_00000.bin"}]}
            needle = ("meta.json: shard file 'val_00000.bin' of split 'val' has the same contents (sha256) as 'train_00000.bin' "
                      "of split 'train': validation would measure training tokens")
        elif name == "shard-twice":  # the train split's one shard listed twice: every window of it seen twice an epoch
            splits["train"]["shards"].append(dict(splits["train"]["shards"][0]))
            splits["train"]["tokens"] *= 2
            needle = "meta.json: shard file 'train_00000.bin' is listed twice in split 'train'"
        else:  # validation reads a training shard: the val loss would measure training data
            splits["val"]["shards"] = [dict(splits["train"]["shards"][0])]
            needle = "meta.json: shard file 'train_00000.bin' is in both split 'train' and split 'val'"
        (data / "meta.json").write_text(json.dumps(meta))
        return _train(cfg, data, out), needle
    if name in ("meta-no-splits", "meta-no-eos", "oov-ids", "tokenizer-outside"):  # a case the fault probe found
        meta = json.loads((data / "meta.json").read_text())
        key = {"meta-no-splits": "splits", "meta-no-eos": "eos_id"}.get(name)
        if key:
            del meta[key]
        elif name == "tokenizer-outside":
            meta["tokenizer"] = {"file": "/etc/hostname"}
        else:  # checksums fine, but a vocabulary of 50 does not hold the shard's largest id
            meta["vocab_size"] = 50
        (data / "meta.json").write_text(json.dumps(meta))
        top = int(np.fromfile(data / "train_00000.bin", dtype="<u2").max())
        assert top >= 50
        return _train(cfg, data, out), {
            "meta-no-splits": "meta.json: no 'splits' (an incomplete or foreign meta.json; rerun `stateloop tokenize`)",
            "meta-no-eos": "meta.json: no 'eos_id' (an incomplete or foreign meta.json; rerun `stateloop tokenize`)",
            "oov-ids": f"train_00000.bin: token id {top} is outside the vocabulary (vocab_size 50 in meta.json; tokenize again)",
            "tokenizer-outside": "meta.json: tokenizer file '/etc/hostname' is not a file name inside the data folder"}[name]
    return {
        "run-not-in-config": (_train(cfg, data, out, "t/stateloop/K9_ds64_seed1234"),
                              "RUN: t/stateloop/K9_ds64_seed1234 is not a run of"),
        "run-escapes-up": (_train(cfg, data, out, "../stateloop/K2_ds32_seed1234"),
                           "RUN: '../stateloop/K2_ds32_seed1234': '..' is not a scale (a run id names a folder inside results/runs)"),
        "run-absolute": (_train(cfg, data, out, "/etc/stateloop/K2_ds32_seed1234"),
                         "RUN: expected a run folder or a run id {scale}/{model}"),
        "seq-longer-than-context": (_train(cfg, data, out, RUN, "train.seq_len=128"),
                                    "train.seq_len: 128 exceeds model.max_seq_len = 64"),
        "seq-longer-than-data": (_train(cfg, data, out), "split 'train' has 20 tokens, fewer than one window of train.seq_len + 1 = 33"),
        "zero-steps": (_train(cfg, data, out, RUN, "train.max_steps=0"), "train.max_tokens: set a token budget (or train.max_steps)"),
        "negative-lr": (_train(cfg, data, out, RUN, "train.lr=-1"), "train.lr: must be positive, got -1.0"),
        "nan-lr": (_train(cfg, data, out, RUN, "train.lr=.nan"), "train.lr: expected a finite number, got nan"),
        # a case the fault probe found
        "init-std-negative": (_train(cfg, data, out, RUN, "model.init_std=-0.02"), "model.init_std: must be positive, got -0.02"),
        "norm-eps-zero": (_train(cfg, data, out, RUN, "model.norm_eps=0"), "model.norm_eps: must be positive, got 0"),
        "mixer-heads-zero": (_train(cfg, data, out, RUN, "model.mixer_heads=0"), "model.mixer_heads: must be positive, got 0"),
        "run-id-newline": (_train(cfg, data, out, RUN + "\n"),
                           "RUN: expected a run folder or a run id {scale}/{model}/K{K}_ds{ds}_seed{seed} (e.g. "),
    }[name]


CASES = ["yaml", "missing-shared-data", "meta-not-json", "meta-not-object", "not-utf8", "empty-text", "run-not-in-config", "run-escapes-up",
         "run-absolute", "seq-longer-than-context", "seq-longer-than-data", "zero-steps", "negative-lr", "nan-lr",
         # a case the fault probe found
         "oov-ids", "meta-no-splits", "meta-no-eos", "init-std-negative", "norm-eps-zero", "mixer-heads-zero", "run-id-newline",
         "long-line", "long-document", "bench-tokens-negative", "bench-prefill-beyond-context", "tokenizer-outside",
         # a case the outside probe of issue 53 found
         "shard-twice", "val-shard-in-train", "whitespace-corpus", "three-words",
         # issue 60's edges
         "val-shard-copies-train", "val-split-shorter-than-window", "scale-without-model"]


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(name, tmp_path, capsys):
    argv, needle = _case(name, tmp_path)
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"stateloop {argv[0]}: error: ") and needle in err[0], err[0]
    assert not (tmp_path / "out").exists()


def test_an_offline_lm_eval_task_without_the_shared_data_names_the_folder(tmp_path, monkeypatch):
    """The `*_local` task YAMLs read $STATELOOP_SHARED/data; where it is absent, one line names
    the folder and the variable (lm-eval's CLI prints it as the error)."""
    from stateloop.evaluate.tasks.hooks import local_dataset

    monkeypatch.setenv("STATELOOP_SHARED", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError) as err:
        local_dataset("piqa_local")(data_files={"validation": "piqa/validation.jsonl"})
    assert str(err.value) == (f"{tmp_path / 'nowhere' / 'data' / 'piqa'}: data folder of piqa_local not found "
                              f"(set STATELOOP_SHARED to the folder holding data/)")


def test_a_corpus_smaller_than_one_training_window_is_refused_at_tokenize_time_also_when_up_to_date(tmp_path, capsys):
    """The request: "a corpus of a few words (warn when the token count is below one training
    window)"; issue 53: it warned, exited 0, and only training refused it. A folder tokenized for a
    shorter window (train.seq_len 8) is up to date for the same data section, and refused as it is
    once the scale's window is longer than its train split; its shards stay."""
    text = tmp_path / "text.txt"
    text.write_text("a few words of text\n")
    out = tmp_path / "out"
    cfg = _tokenize_config(tmp_path, text, "seq_len: 8")
    assert main(["tokenize", "--config", str(cfg), "--scale", "s", "--out", str(out), "--no-progress"]) == 0
    before = sorted(p.name for p in out.iterdir())
    cfg = _tokenize_config(tmp_path, text, "seq_len: 32")
    capsys.readouterr()
    assert main(["tokenize", "--config", str(cfg), "--scale", "s", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stateloop tokenize: error: data.source: {text}: 21 training tokens, fewer than one training window of "
                   f"train.seq_len + 1 = 33 (scales.s.train): nothing to train on; give a larger corpus"], err
    assert sorted(p.name for p in out.iterdir()) == before


def test_shards_without_checksums_are_refused_in_one_line(tmp_path, capsys):
    """A shard whose sha256 meta.json does not record cannot be verified, then or after its bytes
    change (nor can a resume see its data change: that check reads the checksums too). `stateloop
    tokenize` always records them, so such a meta.json was edited or made elsewhere: refused in
    one line, also where an earlier open had verified and stamped the shard."""
    from stateloop.config import ConfigError
    from stateloop.data.shards import ShardSet

    cfg = write_config(tmp_path / "cfg.yaml")
    data = write_shards(tmp_path / "data", n_train=4000, n_val=400)
    assert len(ShardSet(data, "train")) == 4000  # verified and stamped while meta.json had its checksum
    meta = json.loads((data / "meta.json").read_text())
    for shard in meta["splits"]["train"]["shards"]:
        del shard["sha256"]
    (data / "meta.json").write_text(json.dumps(meta))
    shard = data / "train_00000.bin"
    tokens = np.fromfile(shard, dtype="<u2")
    tokens[:2] = tokens[1::-1]  # then the bytes change
    tokens.tofile(shard)
    needle = f"{shard}: meta.json records no sha256 for it, so its contents cannot be verified (tokenize again to record checksums)"
    with pytest.raises(ConfigError) as err:
        ShardSet(data, "train")
    assert str(err.value) == needle
    capsys.readouterr()
    assert main(_train(cfg, data, tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stateloop train: error: {needle}"], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("accelerator", ["cuda", "gpu"])
def test_a_gpu_accelerator_without_a_gpu_is_one_line_naming_the_cpu_rehearsal(accelerator, tmp_path, capsys, monkeypatch):
    """`train.accelerator: cuda` where torch sees no GPU (paper.yaml's setting on a laptop) is refused in
    one line naming the key, the value and what to set, before anything is written (no Lightning
    traceback); the same run with the line's settings trains."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on this CPU machine, also where a GPU is
    cfg, data, out = write_config(tmp_path / "cfg.yaml"), tmp_path / "data", tmp_path / "out"
    write_shards(data, n_train=4000, n_val=400)
    capsys.readouterr()
    assert main(_train(cfg, data, out, RUN, f"train.accelerator={accelerator}", "train.max_steps=2")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("stateloop train: error: train.accelerator: " + accelerator + ", but torch sees no GPU")
    assert "--set train.accelerator=cpu train.precision=32-true" in err[0]
    assert not out.exists()
    fix = err[0].split("--set ")[1].split(" (")[0].split()
    assert main(_train(cfg, data, out, RUN, "train.max_steps=2", *fix, "--no-progress")) == 0
    assert (out / "train.json").is_file()
