"""``stateloop prefetch --config C``: fetch what a config's jobs read from the Hugging Face Hub
(tokenizers, hub datasets' files, lm-eval tasks' data) into the caches, where the network is, so
that the jobs can run offline (ops/prefetch.py; docs/cluster.md, "Before you send paper.yaml").

    stateloop prefetch --config configs/paper.yaml                # on a login node, once
    stateloop prefetch --config configs/paper.yaml --check        # anywhere: what is missing (never uses the network)
    HF_HOME=/shared/hf stateloop prefetch --config configs/paper.yaml   # the cache the jobs read

Rerun it safely: it fetches only what is missing (an interrupted download resumes).
"""

from __future__ import annotations

from stateloop.config import Bool, StageRequest, Text, arg
from stateloop.experiments import load_checked
from stateloop.ops.cluster import check_cluster
from stateloop.ops.prefetch import NotPrefetched, caches, config_needs, go_offline, prefetch, say


class Request(StageRequest):
    config: Text = arg("pipeline config (configs/*.yaml)")
    scales: list[Text] | None = arg("only these scales (default: every trained one)", None, nargs="+", metavar="SCALE")
    check: Bool = arg("fetch nothing, never touch the network (the Hub switched off as on a compute node): say whether "
                      "everything is in the caches, as an offline job would find it", False)


def run(args: Request) -> int:
    if args.check:  # offline by construction, before anything reads the Hub's settings
        go_offline()
    pipeline, runs = load_checked(args.config)
    check_cluster(pipeline, args.config)
    needs = config_needs(pipeline, runs, args.scales)
    if not args.check:
        return prefetch(needs, args.config)
    missing = [m for need in needs if (m := need.check()) is not None]
    if missing:
        raise NotPrefetched(f"not in the caches ({caches()}): {'; '.join(missing)}; run `stateloop prefetch --config "
                            f"{args.config}` where the network is")
    say(f"{args.config}: all {len(needs)} needs are in the caches ({caches()})")
    return 0
