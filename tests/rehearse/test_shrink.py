"""What `stateloop rehearse` keeps of a config's job layout when it shrinks the sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_paper_rehearsal_runs_the_analyses_sharded():
    """paper.yaml splits the 410M analyses into shards with a merge (resources.analyze.*_shards); the
    rehearsal keeps that layout, at most two shards each, so the sharded jobs and their merge run
    offline before a cluster sees them. A config without shards stays unsharded."""
    from stateloop.ops.rehearse.config import shrink

    raw = yaml.safe_load((ROOT / "configs" / "paper.yaml").read_text())
    assert raw["scales"]["410m"]["resources"]["analyze"]["shapley_shards"] > 2  # the point of the min below
    out = shrink(raw)["scales"]
    assert {k: out["410m"]["resources"]["analyze"].get(k) for k in ("shapley_shards", "interventions_shards")} == \
        {"shapley_shards": 2, "interventions_shards": min(2, raw["scales"]["410m"]["resources"]["analyze"]["interventions_shards"])}
    assert "shapley_shards" not in out["1.4b"]["resources"]["analyze"]
    tiny = shrink(yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text()))["scales"]
    assert all("shapley_shards" not in s["resources"].get("analyze", {}) for s in tiny.values() if "resources" in s)


def test_every_rehearsal_trains_on_the_cpu_past_the_gpu_check(monkeypatch):
    """The GPU configs say `train.accelerator: cuda`, which training refuses where torch sees no GPU
    (train/loop.py require_accelerator); their rehearsals set `cpu`, so they pass it on this machine."""
    import torch

    from stateloop.config import ConfigError
    from stateloop.config.train import TrainConfig
    from stateloop.ops.rehearse.config import shrink
    from stateloop.train.loop import require_accelerator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpu = []
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if "scales" not in raw:
            continue
        for name, scale in shrink(raw)["scales"].items():
            accelerator = str(((raw["scales"][name] or {}).get("train") or {}).get("accelerator", "auto"))
            if accelerator in ("cuda", "gpu"):
                gpu.append(f"{path.stem}/{name}")
                with pytest.raises(ConfigError, match=f"train.accelerator: {accelerator}, but torch sees no GPU"):
                    require_accelerator(TrainConfig(accelerator=accelerator))
            assert scale["train"]["accelerator"] == "cpu", f"{path.name} {name}"
            require_accelerator(TrainConfig(accelerator=scale["train"]["accelerator"]))
    assert {"paper/1.4b", "paper/410m", "gpu/gpu"} <= set(gpu)
