"""What models/flops.py's ``compute_profile`` has counted, by (config, seq_len): a table of its own
that imports nothing, so that a command swaps in one kept on disk (ops/measured.py:
``keep_flop_counts``) without importing torch; models/ reads no cache of its own."""

PROFILES: dict[str, dict] = {}  # counts of seconds each at a deep shape, as dicts (ComputeProfile's fields)
