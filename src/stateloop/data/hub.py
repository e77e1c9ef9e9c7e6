"""What a config's jobs read from the Hugging Face Hub: checked at each job's start where there is no
network (one line naming every missing piece and the prefetch command, before any work: not at the
end of a 30-hour training), and fetched ahead by ``stateloop prefetch`` (ops/prefetch.py) where
there is, into the shared ``HF_HOME`` the offline SLURM jobs read (workflow/rules/common.smk).

A scale's needs (:func:`data_needs`; evaluate/tasks/needs.py: ``task_needs``): the hub tokenizer's
``tokenizer.json``; the hub corpus's files of the splits the tokenize stage reads (``data_files``'
patterns, else the card's ``configs:`` for ``hub_config``, else every file; README.md always;
huggingface_hub's recorded listing tells an interrupted snapshot from a complete one offline); the
datasets of the scale's lm-eval tasks. Fetching is resumable and fetches only what is missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from stateloop.config import ConfigError
from stateloop.config.data import DataConfig, is_local_source
from stateloop.data.tokenizer import is_local_tokenizer

CARD = "README.md"
TOKENIZER_FILE = "tokenizer.json"  # data/tokenizer.py's name for it


class NotPrefetched(ConfigError):
    """Offline, and something a job reads is not in the caches. One line."""


def say(msg: str) -> None:
    print(f"stateloop prefetch: {msg}", file=sys.stderr, flush=True)


def offline() -> bool:
    """Whether huggingface_hub (and with it datasets) is offline in this process (HF_HUB_OFFLINE,
    read when it is imported; datasets also reads HF_DATASETS_OFFLINE)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_DATASETS_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def caches() -> str:
    """The caches this process reads, in words (for the messages)."""
    from huggingface_hub import constants

    datasets_cache = os.environ.get("HF_DATASETS_CACHE") or os.path.join(constants.HF_HOME, "datasets")
    return f"HF_HUB_CACHE={constants.HF_HUB_CACHE}, HF_DATASETS_CACHE={datasets_cache}"


@dataclass(frozen=True)
class Need:
    """One thing from the Hub: what it is, how to fetch it, and how to tell offline whether it is
    there (``check`` returns None when it is, else what is missing, in a few words)."""

    what: str  # e.g. "tokenizer EleutherAI/gpt-neox-20b"
    fetch: Callable[[], str]  # returns a line saying what it fetched
    check: Callable[[], str | None]
    key: str = ""  # two needs of the same key are one (default: what)


# ----------------------------------------------------------------------------------------------
# Corpus


def hub_corpus(data: DataConfig) -> str | None:
    """The hub dataset in ``data.source`` (None: synthetic or local files)."""
    source = data.source
    if not isinstance(source, str) or source == "synthetic" or is_local_source(source):
        return None
    return source


def _as_list(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def card_front(card_text: str | None) -> dict:
    """A dataset card's YAML front matter ({} where it has none)."""
    lines = (card_text or "").splitlines()
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
    if not lines or lines[0].strip() != "---" or end is None:
        return {}
    try:
        front = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError:
        return {}
    return front if isinstance(front, dict) else {}


def card_patterns(card_text: str | None, config: str | None, splits: list[str]) -> list[str] | None:
    """The data files the dataset card's ``configs:`` give config ``config`` (None: its default) for
    ``splits``; None where the card names none (then every file of the repository)."""
    configs = card_front(card_text).get("configs")
    if not isinstance(configs, list):
        return None
    chosen = next((e for e in configs if isinstance(e, dict) and (
        e.get("config_name", "default") == (config or "default") or (config is None and e.get("default")))), None)
    if chosen is None:
        return None
    files = chosen.get("data_files")
    if isinstance(files, str):
        return [files]
    out: list[str] = []
    if isinstance(files, dict):  # split -> path(s)
        for split, paths in files.items():
            if not splits or split in splits:
                out += _as_list(paths)
    elif isinstance(files, list):  # paths, or {split, path} entries
        for item in files:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, dict) and (not splits or item.get("split", "train") in splits):
                out += _as_list(item.get("path"))
    return out or None


def corpus_patterns(data: DataConfig, card_text: str | None) -> list[str] | None:
    """The repository files the tokenize stage reads (``allow_patterns``); None: every file."""
    splits = [s for s in (data.split, data.val_split, data.test_split) if s]
    if data.data_files is not None:
        patterns = [p for s in splits for p in _as_list(data.data_files.get(s))]
    else:
        patterns = card_patterns(card_text, data.hub_config, splits)
        if patterns is None:
            return None
    return [CARD, *dict.fromkeys(patterns)]


def corpus_snapshot(data: DataConfig) -> Path:
    """The complete cached snapshot of the hub dataset ``data.source`` that the tokenize stage reads
    offline (only the files it needs); :class:`NotPrefetched` names the missing files otherwise."""
    from huggingface_hub import constants, get_cached_repo_tree
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils import filter_repo_objects

    repo = hub_corpus(data)
    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="dataset")
    ref = storage / "refs" / "main"
    commit = ref.read_text().strip() if ref.is_file() else None
    try:  # the snapshot's file listing, which snapshot_download recorded when it fetched
        tree = get_cached_repo_tree(repo, repo_type="dataset", revision=commit) if commit else None
    except Exception:  # noqa: BLE001 - no listing: never fetched by snapshot_download
        tree = None
    if not tree:
        raise NotPrefetched(f"dataset {repo}: not in the hub cache")
    folder = storage / "snapshots" / commit
    card = folder / CARD
    patterns = corpus_patterns(data, card.read_text(encoding="utf-8") if card.is_file() else None)
    wanted = list(filter_repo_objects([f.path for f in tree], allow_patterns=patterns))
    missing = [p for p in wanted if not (folder / p).is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise NotPrefetched(f"dataset {repo}: {len(missing)} of {len(wanted)} files missing ({shown})")
    return folder


def data_needs(data: DataConfig) -> list[Need]:
    """What the tokenize stage of a ``data:`` section reads from the Hub."""
    out, name = [], data.tokenizer
    if name != "bpe" and not is_local_tokenizer(name):
        def fetch_tokenizer() -> str:
            from huggingface_hub import hf_hub_download

            return f"tokenizer {name}: {hf_hub_download(name, TOKENIZER_FILE)}"

        def check_tokenizer() -> str | None:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(name, TOKENIZER_FILE)
            return None if isinstance(found, str) else f"tokenizer {name} ({TOKENIZER_FILE})"

        out.append(Need(f"tokenizer {name}", fetch_tokenizer, check_tokenizer))
    if (repo := hub_corpus(data)) is None:
        return out

    def fetch() -> str:
        from huggingface_hub import hf_hub_download, snapshot_download
        from huggingface_hub.errors import EntryNotFoundError

        try:
            card = Path(hf_hub_download(repo, CARD, repo_type="dataset")).read_text(encoding="utf-8")
        except EntryNotFoundError:
            card = None
        patterns = corpus_patterns(data, card)
        plan = snapshot_download(repo, repo_type="dataset", allow_patterns=patterns, dry_run=True)
        todo = [f for f in plan if f.will_download]
        size = sum(f.file_size or 0 for f in todo)
        say(f"dataset {repo}: {len(plan)} files ({', '.join(patterns or ['all'])}), "
            f"{len(todo)} to download ({size / 1e6:,.1f} MB)")
        folder = snapshot_download(repo, repo_type="dataset", allow_patterns=patterns)
        return f"dataset {repo}: {len(plan)} files in {folder}"

    def check() -> str | None:
        try:
            corpus_snapshot(data)
        except NotPrefetched as err:
            return str(err)
        return None

    key = repr((repo, data.hub_config, data.data_files, data.split, data.val_split, data.test_split))
    return [*out, Need(f"dataset {repo}", fetch, check, key)]


# ----------------------------------------------------------------------------------------------
# Requiring them offline


def require(needs: list[Need], config: str | None) -> None:
    """Offline only: stop in one line naming everything of ``needs`` the caches lack, and the
    prefetch command; nothing online (a job with the network fetches what it reads itself)."""
    if not needs or not offline():
        return
    missing = [m for need in needs if (m := need.check()) is not None]
    if missing:
        command = f"stateloop prefetch --config {config}" if config else "stateloop prefetch --config CONFIG"
        raise NotPrefetched(f"offline (HF_HUB_OFFLINE=1), and not in the caches ({caches()}): {'; '.join(missing)}; "
                            f"run `{command}` where the network is, with the jobs' HF_HOME")
