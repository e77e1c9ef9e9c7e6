"""Exports of trained runs in the formats other tools load: :mod:`stateloop.export.hf` (a Hugging
Face model directory), whose remote code is :mod:`stateloop.export.hf_modeling`."""
