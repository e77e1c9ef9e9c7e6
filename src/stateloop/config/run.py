"""One run's config: resolved once per process, typed, and the same type when a run folder's saved
config is read back (docs/architecture.md#how-a-runs-config-resolves)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from stateloop.config import ConfigError, Text, from_dict, section, to_dict
from stateloop.config.evaluate import EvalConfig
from stateloop.config.model import ModelConfig
from stateloop.config.train import TrainConfig
from stateloop.run_ids import split_run_id

RUN_SECTIONS = ("model", "train", "data")  # the sections a key=value override may name
FIXED_BY_RUN_ID = ("name", "K", "d_s")  # model keys the run id sets


@section(frozen=True)
class RunSection:
    """Which run a resolved config is; the model, K, d_s and seed its id spells are saved in the
    model section and as ``train.seed``."""

    id: Text = ""
    scale: Text = ""
    config: Text = ""
    experiments: list[Text] = Field(default_factory=list)

    @property
    def model(self) -> str:
        return split_run_id(self.id)[1]

    @property
    def K(self) -> int:
        return split_run_id(self.id)[2]


@section(frozen=True)
class DataSection:
    dir: Text = Field("", description="absolute path of the token shards")


@section(frozen=True)
class RunConfig:
    """The resolved config of one run (run, model, train, data), as training reads it and its
    folder's config.yaml saves it; ``eval`` is resolved when it is evaluated (resolve.py)."""

    run: RunSection
    model: ModelConfig
    train: Annotated[TrainConfig | None, Field(description="None only where a finished run's saved config has no train section "
                                                           "(read: saved)")]
    data: DataSection
    eval: EvalConfig | None = Field(None, description="[choice] Resolved when the run is evaluated (resolve.resolve_eval), never by "
        "training nor by read: it is not saved (as_dict), so changing the eval settings never retrains a run.")

    @property
    def d_s(self) -> int:
        return self.model.d_s

    def as_dict(self) -> dict:
        """The mapping written to config.yaml and the final weights; never ``eval`` (see the field)."""
        return {"run": to_dict(self.run), "model": to_dict(self.model), "train": to_dict(self.train),
                "data": to_dict(self.data)}

    @classmethod
    def read(cls, config: dict, where: str = "resolved config", saved: bool = False) -> RunConfig:
        """A resolved config read back strictly; other sections (``eval``) are ignored. ``saved``: a
        finished run's, from a folder that may come from elsewhere: [choice] a section it lacks reads
        as its defaults (train as None), a bad key is one line naming ``where`` and the key."""
        if not isinstance(config, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(config).__name__}")
        sections = {}
        for key, tp in (("run", RunSection), ("model", ModelConfig), ("train", TrainConfig), ("data", DataSection)):
            if key not in config and not saved:
                raise ConfigError(f"{key}: missing section in the {where}")
            if key not in config:
                sections[key] = None if key == "train" else tp()
                continue
            try:
                sections[key] = from_dict(tp, config[key], key)
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}" if saved else str(err)) from None
        return cls(**sections)

