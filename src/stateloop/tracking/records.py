"""What a run records besides its metrics, for training and the stages after it alike: a config
as params (flattened, logged once), MLflow's own tags for who and what made the run, and the
token splits read as the run's dataset inputs."""

from __future__ import annotations

import json
import os

from stateloop.files import code_version


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"model": {"K": 3}} -> {"model.K": "3"}; lists and scalars become strings."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = str(value)
    return out


def standard_tags(command: str) -> dict[str, str]:
    """MLflow's own tags (the UI's "User", "Source", "Git commit") for a run made by ``stateloop COMMAND``."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    tags = {"mlflow.user": user, "mlflow.source.name": f"stateloop {command}",
            "mlflow.source.type": "JOB" if os.environ.get("SLURM_JOB_ID") else "LOCAL"}
    if code_version() != "unknown":
        tags["mlflow.source.git.commit"] = code_version().removesuffix("+dirty")
    return tags


def log_params(c, run_id: str, params: dict[str, str], changed_prefix: str) -> None:
    """Log params once: only keys not logged before (MLflow params are immutable); a changed value
    is kept as the tag ``{changed_prefix}{key}``."""
    from mlflow.entities import Param

    existing = c.get_run(run_id).data.params
    new = [Param(k, v[:6000]) for k, v in params.items() if k not in existing]
    for i in range(0, len(new), 100):
        c.log_batch(run_id, params=new[i : i + 100])
    for key, value in params.items():
        if key in existing and existing[key] != value[:6000]:
            c.set_tag(run_id, f"{changed_prefix}{key}", value[:5000])


def log_datasets(c, run_id: str, scale: str, shard_sets: dict) -> None:
    """Each split a run read (``shard_sets``: MLflow context -> ShardSet) as an MLflow dataset input
    named ``<scale>/<split>``, its digest the split's fingerprint in meta.json (equal exactly when
    the tokens are): a resumed run logs nothing twice, runs that read the same tokens share it."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = []
    for context, shards in shard_sets.items():
        split = shards.meta["splits"][shards.split]
        tokenizer = shards.meta.get("tokenizer")
        profile = {"split": shards.split, "tokens": split.get("tokens"), "documents": split.get("documents"),
                   "split_source": split.get("source"), "vocab_size": shards.vocab_size,
                   "tokenizer": tokenizer.get("kind") if isinstance(tokenizer, dict) else None}
        dataset = Dataset(name=f"{scale}/{shards.split}", digest=shards.fingerprint(), source_type="local",
                          source=json.dumps({"uri": str((shards.dir / "meta.json").resolve())}),
                          profile=json.dumps(profile))
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)]))
    c.log_inputs(run_id, datasets=inputs)
