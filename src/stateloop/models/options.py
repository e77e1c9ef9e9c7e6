"""The options (``model.options``) of the models in models/looped.py, torch-free: a config check
reads them without loading the models."""

from __future__ import annotations

from pydantic import Field

from stateloop.config import Int, section


@section
class FFNOptions:
    d_ff: Int | None = Field(None, description="SwiGLU width; None: matched to stateloop_mamba2 at d_s = d (5818 at 1.4B)")
