"""A registered model as a transformers model: the remote code of an export.

``stateloop export RUN --out DIR`` (:mod:`stateloop.export.hf`) copies this file into DIR as
``modeling_stateloop.py``, together with the project's own modules it imports (the registry, the
model modules, the config reader), each import ``from stateloop.a.b import x`` rewritten to the
flat ``from .stateloop_a_b import x`` that transformers' remote-code loader follows. So

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)

builds the very modules the project trains (no second copy of the model code exists) with only
torch, transformers, PyYAML and pydantic installed. In the project it imports as
``stateloop.export.hf_modeling`` (the tests compare the two routes).

The model decodes through :class:`~stateloop.models.cache.ModelCache` (one KV cache per
iteration and layer, the mixers' states), which ``generate()`` carries from step to step as the
model's cache (under the name the installed transformers uses for it: ``cache``, or ``past_key_values`` before 5.x).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from stateloop.config import from_dict
from stateloop.config.model import ModelConfig
from stateloop.models.cache import ModelCache
from stateloop.models.registry import build_model


class StateLoopConfig(PretrainedConfig):
    """``stateloop_model``: the run's resolved ``model:`` section (every key of
    :class:`~stateloop.config.model.ModelConfig`); ``max_position_embeddings``: the context the
    run was trained with, which lm-eval's HF backend takes as its window."""

    model_type = "stateloop"

    def __init__(self, stateloop_model: dict | None = None, max_position_embeddings: int | None = None,
                 stateloop_run: dict | None = None, **kwargs) -> None:
        self.stateloop_model = dict(stateloop_model or {})
        self.stateloop_run = dict(stateloop_run or {})  # the run id and code version the export came from
        self.vocab_size = self.stateloop_model.get("vocab_size")
        self.max_position_embeddings = max_position_embeddings or self.stateloop_model.get("max_seq_len")
        kwargs.setdefault("tie_word_embeddings", False)  # every model has an untied head
        super().__init__(**kwargs)

    def model_config(self) -> ModelConfig:
        return from_dict(ModelConfig, self.stateloop_model, "stateloop_model")


# The output field generate() carries the cache in: `cache` from transformers 5.x on (which refuses the old
# name beside it), `past_key_values` before.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class StateLoopForCausalLM(PreTrainedModel, GenerationMixin):
    """The registry's model for ``StateLoopConfig.stateloop_model`` under ``self.model``."""

    config_class = StateLoopConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules: list[str] = []

    def __init__(self, config: StateLoopConfig) -> None:
        super().__init__(config)
        # The project's own init (registry.build_model); from_pretrained then sets every parameter
        # from the export's weights (building on the meta device, where the init costs nothing).
        self.model = build_model(config.model_config())
        self.post_init()

    def _init_weights(self, module) -> None:
        pass  # transformers' generic init (N(0, 0.02) everywhere) would undo the depth-scaled one above

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model brings its own cache (prepare_inputs_for_generation)

    def get_input_embeddings(self):
        return self.model.embed

    def get_output_embeddings(self):
        return self.model.head

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                cache: ModelCache | None = None, past_key_values: ModelCache | None = None,
                labels: torch.LongTensor | None = None, use_cache: bool | None = None,
                return_dict: bool | None = None, **kwargs) -> CausalLMOutputWithPast:
        """input_ids (B, T) -> next-token logits (B, T, V); with a cache, input_ids continue the
        tokens already in it. ``labels`` (B, T): the mean next-token cross-entropy (ids -100 are
        skipped), as transformers' causal models compute it."""
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("stateloop models take no padding mask: every position is a real token "
                             "(decode one sequence at a time, or sequences of equal length)")
        cache = cache if isinstance(cache, ModelCache) else past_key_values if isinstance(past_key_values, ModelCache) else None
        logits = self.model(input_ids, cache=cache).logits
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, cache=None, past_key_values=None,
                                      attention_mask=None, use_cache: bool | None = None, **kwargs) -> dict:
        """The first step runs the whole prompt into a new cache; each later step only the tokens
        the cache has not seen. Without the cache (``use_cache=False``) every step runs the whole
        sequence again."""
        if use_cache is False:
            return {"input_ids": input_ids, "attention_mask": attention_mask}
        cache = cache if isinstance(cache, ModelCache) else past_key_values if isinstance(past_key_values, ModelCache) else None
        if cache is None:
            cache = ModelCache()
        return {"input_ids": input_ids[:, cache.seq_len:], "cache": cache, "attention_mask": attention_mask}
