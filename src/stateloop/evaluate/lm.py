"""The lm-eval model ``stateloop``: any run folder, every registered variant.

    stateloop lm-eval --model stateloop --model_args pretrained=results/runs/tiny/stateloop/K4_ds64_seed1234 ...

(lm-eval's command line with this model registered first: see ``stateloop.commands.lm_eval``), or
``simple_evaluate(model=StateLoopEvalLM.from_run(run_dir), ...)`` as ``stateloop eval`` does. As
lm-eval's HF backend (HFLM) does, a missing CUDA device falls back to the CPU with a warning, and
``batch_size=auto`` (``auto:N``) halves ``max_batch_size`` until the longest requests fit. The
variant, its shape and the tokenizer come from the run folder, never from arguments.

Scoring, in the harness's terms. A request (context c, continuation y) with token ids
c_1..c_m, y_1..y_n is scored as

    log p(y | c) = sum_{j=1..n} log softmax(f(c, y_<j))[y_j]

from one causal forward pass over the last L + 1 tokens of c ++ y (L = the context window: the
run's training ``seq_len``, else the model's ``max_seq_len``, unless the eval config sets one;
longer inputs lose tokens on the left, as lm-eval's HF backend does). Documents longer than L
(``loglikelihood_rolling``) are cut into lm-eval's disjoint rolling windows: every token is
predicted exactly once, the first from the end-of-document token.

Why not subclass lm-eval's ``HFLM`` (as its mamba backend does): HFLM builds transformers
models and tokenizers and generates through ``model.generate``; our models decode through
:class:`stateloop.models.cache.ModelCache`. The batching here follows HFLM's: requests sorted by
length, longest first (lm-eval's ``Collator``), right padding, results back in request order.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm.auto import tqdm

from stateloop.config import ConfigError
from stateloop.config.run import RunConfig
from stateloop.data.tokenizer import load_tokenizer, meta_eos_id
from stateloop.fast import accelerate
from stateloop.models.generate import greedy_steps
from stateloop.runs import FINAL_WEIGHTS, load_model, resolve_device, run_id_of, saved_run_config, trained_length

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# Loading a run folder


@dataclass
class LoadedRun:
    model: torch.nn.Module
    config: RunConfig  # the resolved run config saved with the weights (runs.saved_run_config)
    tokenizer: object  # tokenizers.Tokenizer
    eos_id: int
    data_dir: Path
    run_id: str


def load_run(run_dir: str | Path, device: str = "auto", config: RunConfig | None = None) -> LoadedRun:
    """Model (eval mode, on ``device``), resolved config and tokenizer of a run folder. ``config``:
    the folder's saved config already read (resolve.resolve_eval's), else read here."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    model, saved = load_model(run_dir, device=resolve_device(device))  # also checks the folder's config.yaml
    accelerate(model)  # the fused inference forms (stateloop/fast.py)
    config = config if config is not None else saved_run_config(run_dir, saved)
    if not config.data.dir:
        raise ConfigError(f"{run_dir / FINAL_WEIGHTS}: the saved config has no data.dir (where the tokenizer is)")
    data_dir = Path(config.data.dir)
    eos_id = meta_eos_id(data_dir)
    tokenizer = load_tokenizer(data_dir)  # checked against meta.json's sha256
    n_tok = tokenizer.get_vocab_size()
    if n_tok > model.cfg.vocab_size:
        raise ConfigError(f"{data_dir / 'tokenizer.json'}: {n_tok} ids do not fit the model's vocab_size {model.cfg.vocab_size}")
    return LoadedRun(model, config, tokenizer, eos_id, data_dir, run_id_of(run_dir, config))


# ----------------------------------------------------------------------------------------------
# The lm-eval model


def eval_device(name: str) -> torch.device:
    """The device to evaluate on, by HFLM's rule: a CUDA device this machine does not have (lm-eval's
    command line asks for ``cuda:0`` by default) becomes ``cuda`` when there is one, else the CPU,
    with a warning."""
    device = torch.device(resolve_device("auto") if name == "auto" else name)
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        fallback = resolve_device("auto")
        log.warning("device %s: not available on this machine; using %s", name, fallback)
        return fallback
    return resolve_device(str(device))


def parse_batch_size(value) -> tuple[int | str, int]:
    """lm-eval's ``batch_size``: an integer, ``auto`` or ``auto:N`` -> (size or "auto", N)."""
    text = str(value)
    try:
        if text.startswith("auto"):
            schedule = int(text.partition(":")[2] or 1)
            if schedule > 0:
                return "auto", schedule
        elif int(text) > 0:
            return int(text), 1
    except ValueError:
        pass
    raise ValueError(f"batch_size: expected a positive integer, auto or auto:N; got {value!r}")


def largest_batch(forward, start: int) -> int:
    """The largest of ``start``, ``start // 2``, ``start // 4``, ... for which ``forward(size)`` runs
    without running out of device memory (1 when none does), as HFLM's automatic batch size."""
    size = start
    while size > 1:
        try:
            forward(size)
            return size
        except torch.cuda.OutOfMemoryError:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            size //= 2
    return 1


def _model_takes_cache(model: torch.nn.Module) -> bool:
    try:
        return "cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@register_model("stateloop")
class StateLoopEvalLM(TemplateLM):
    """lm-eval's view of one trained model. See the module docstring for the scoring rule."""

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        run_dir: str | None = None,
        model: torch.nn.Module | None = None,
        tokenizer=None,
        eos_id: int | None = None,
        batch_size: int | str = 16,
        max_length: int | str | None = None,
        device: str = "auto",
        precision: str = "32-true",
        use_cache: bool | str = True,
        max_batch_size: int | str | None = 64,  # the first size batch_size=auto tries
        name: str | None = None,
    ) -> None:
        super().__init__()
        if pretrained is not None and run_dir is not None:
            raise ValueError(f"pretrained={pretrained} and run_dir={run_dir}: give the run folder once (run_dir is an alias)")
        run_dir = pretrained if pretrained is not None else run_dir
        if run_dir is not None:
            if model is not None:
                raise ValueError("give either run_dir or model, not both")
            run = load_run(run_dir, str(eval_device(device)))
            model, tokenizer, eos_id = run.model, run.tokenizer, run.eos_id
            name = name or run.run_id
            if max_length in (None, "", "None"):
                max_length = trained_length(run.config)
        if model is None or tokenizer is None or eos_id is None:
            raise ValueError("StateLoopEvalLM needs run_dir, or model, tokenizer and eos_id")
        self._device = eval_device(device) if run_dir is None else next(model.parameters()).device
        self.model = model.to(self._device).eval()  # its fused forms as its caller set them (load_run: on)
        self.tokenizer = tokenizer
        self._eos_id = int(eos_id)
        self.batch_size, self.batch_schedule = parse_batch_size(batch_size)
        self.max_batch_size = int(max_batch_size) if max_batch_size not in (None, "", "None") else 64
        self.batch_sizes: dict[int, int] = {}  # auto: slot of the sorted requests -> detected size (lm-eval reports them)
        self.max_length = int(max_length) if max_length not in (None, "", "None") else model.cfg.max_seq_len
        if self.max_length <= 1:
            raise ValueError(f"max_length: the context window must hold at least 2 tokens, got {self.max_length}")
        if self.max_batch_size <= 0:
            raise ValueError(f"max_batch_size: must be positive, got {self.max_batch_size}")
        if precision not in ("32-true", "bf16-mixed"):
            raise ValueError(f"precision must be 32-true or bf16-mixed, got {precision!r}")
        self.precision = precision
        self.use_cache = str(use_cache).lower() not in ("false", "0", "no") and _model_takes_cache(model)
        self._name = name or getattr(model.cfg, "name", "stateloop")
        self._n_token_ids = tokenizer.get_vocab_size()

    @classmethod
    def from_run(cls, run_dir: str | Path, **kwargs) -> StateLoopEvalLM:
        return cls(str(run_dir), **kwargs)

    # -- batch size -----------------------------------------------------------------------------
    def _batch_size_at(self, pos: int, n: int, length: int) -> int:
        """Batch size for the batch starting at position ``pos`` of ``n`` requests sorted longest
        first (``length`` tokens: the longest of the batch): the fixed size, or with ``auto:N``
        the size detected for the first batch of each of N equal slots of the requests."""
        if self.batch_size != "auto":
            return self.batch_size
        slot = pos * self.batch_schedule // n
        if slot not in self.batch_sizes:
            self.batch_sizes[slot] = self._detect_batch_size(length)
            log.info("batch_size auto: %d sequences of %d tokens per batch", self.batch_sizes[slot], length)
        return self.batch_sizes[slot]

    def _detect_batch_size(self, length: int) -> int:
        """The largest batch of ``length``-token inputs that fits (module docstring)."""
        if self._device.type != "cuda":
            return self.max_batch_size
        return largest_batch(lambda size: self._logits(
            torch.full((size, length), self._eos_id, dtype=torch.long, device=self._device)), self.max_batch_size)

    def _batches(self, ordered: list) -> list[list]:
        """Consecutive batches of the longest-first ``ordered`` requests ((pair, ctx ids, cont ids))."""
        self.batch_sizes.clear()
        batches, pos = [], 0
        while pos < len(ordered):
            _, ctx, cont = ordered[pos]
            size = self._batch_size_at(pos, len(ordered), min(len(ctx) + len(cont) - 1, self.max_length))
            batches.append(ordered[pos : pos + size])
            pos += size
        return batches

    # -- tokenizer ------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self._eos_id

    @property
    def tokenizer_name(self) -> str:
        return f"stateloop-{self._name}".replace("/", "__")

    @property
    def device(self) -> torch.device:
        return self._device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # Documents are separated by eos_id in the shards; no BOS or other template tokens are added.
        return self.tokenizer.encode(string, add_special_tokens=False).ids

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # -- forward --------------------------------------------------------------------------------
    def autocast(self):
        """The precision context of every forward pass: bf16 autocast for ``bf16-mixed`` (on a CPU
        too, where it is the nearest run of the GPU setting), else nothing."""
        return torch.autocast(self._device.type, torch.bfloat16, enabled=self.precision == "bf16-mixed")

    def _logits(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        """(B, T) ids -> (B, T, V) float32 logits (under :meth:`autocast`)."""
        with torch.inference_mode(), self.autocast():
            out = self.model(idx, cache=cache) if cache is not None else self.model(idx)
        return out.logits.float()

    # -- loglikelihood ---------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, hook: bool = True) -> list[tuple[float, bool]]:
        """requests: ((context, continuation), context ids, continuation ids). Sorted longest
        first, scored in batches of right-padded inputs, returned in request order."""
        L = self.max_length

        def longest_first(req):
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        ordered = Collator(requests, sort_fn=longest_first)
        results = []
        bar = tqdm(total=len(requests), desc="loglikelihood", disable=disable_tqdm, leave=False)
        for chunk in self._batches([req for (req,) in ordered.get_batched(n=1)]):
            inputs, conts = [], []
            for _, ctx, cont in chunk:
                if not ctx or not cont:
                    raise ValueError("a loglikelihood request needs a non-empty context and continuation")
                if len(cont) > L:
                    raise ConfigError(f"a continuation of {len(cont)} tokens is longer than the model's context window "
                                      f"({L} tokens, model.max_seq_len): it cannot be scored; shorten the task's "
                                      f"continuations or evaluate a model with a longer window")
                inputs.append((ctx + cont)[-(L + 1):][:-1])  # truncate on the left, drop the last token
                conts.append(cont)
            T = max(len(x) for x in inputs)
            batch = torch.full((len(inputs), T), self._eos_id, dtype=torch.long)
            for i, x in enumerate(inputs):
                batch[i, : len(x)] = torch.tensor(x, dtype=torch.long)  # right padding: causal, so harmless
            logits = self._logits(batch.to(self._device))
            for (pair, _, _), x, cont, row in zip(chunk, inputs, conts, logits):
                n = len(cont)
                logp = F.log_softmax(row[len(x) - n : len(x)], dim=-1)  # positions predicting the continuation
                target = torch.tensor(cont, device=logp.device)
                ll = float(logp.gather(-1, target[:, None]).sum())
                greedy = bool((logp.argmax(-1) == target).all())
                results.append((ll, greedy))
                if hook:
                    self.cache_hook.add_partial("loglikelihood", pair, (ll, greedy))
            bar.update(len(chunk))
        bar.close()
        return ordered.get_original(results)

    def rolling_windows(self, tokens: list[int]) -> list[tuple[list[int], list[int]]]:
        """lm-eval's disjoint rolling windows (context ids, predicted ids) over a document."""
        return [make_disjoint_window(w) for w in get_rolling_token_windows(
            token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Total log-probability of each document, every token predicted once (module docstring)."""
        windows, owner = [], []
        for i, req in enumerate(requests):
            (text,) = req.args
            for ctx, cont in self.rolling_windows(self.tok_encode(text)):
                windows.append(((text, ""), ctx, cont))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm, hook=False)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, scores):
            totals[i] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation ------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuation of each context until a stop string, end-of-document or
        ``max_gen_toks``. Contexts of equal length decode together; with the model's KV cache
        (prefill once, then one token per step) unless the model has none (then the whole
        sequence is recomputed every step)."""
        items = []
        for i, req in enumerate(requests):
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_gen = int(kwargs.pop("max_gen_toks", 256))
            if kwargs.pop("do_sample", False) or float(kwargs.pop("temperature", 0.0) or 0.0) > 0:
                raise ValueError("stateloop decodes greedily only: do_sample must be false and temperature 0")
            if max_gen >= self.max_length:
                raise ValueError(f"max_gen_toks {max_gen} leaves no room for context in the window {self.max_length}")
            ids = self.tok_encode(context) if context else [self.prefix_token_id]
            ids = ids[-(self.max_length - max_gen):]  # the whole sequence stays inside the window
            items.append((i, ids, until, max_gen))
        items.sort(key=lambda it: (-len(it[1]), it[3], it[0]))
        out: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(items), desc="generate_until", disable=disable_tqdm, leave=False)
        self.batch_sizes.clear()
        start = 0
        while start < len(items):
            end = start + 1
            size = self._batch_size_at(start, len(items), len(items[start][1]) + items[start][3])
            while (end < len(items) and end - start < size
                   and len(items[end][1]) == len(items[start][1]) and items[end][3] == items[start][3]):
                end += 1
            group = items[start:end]
            for (i, _, _, _), text in zip(group, self._greedy(group)):
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
            bar.update(len(group))
            start = end
        bar.close()
        return out

    def _greedy(self, group) -> list[str]:
        max_gen = group[0][3]
        seqs = torch.tensor([ids for _, ids, _, _ in group], dtype=torch.long, device=self._device)
        generated = [[] for _ in group]
        done = [False] * len(group)
        # Only ids the tokenizer can decode are chosen (the embedding may be padded past them).
        steps = greedy_steps(self._logits, seqs, use_cache=self.use_cache, n_vocab=self._n_token_ids)
        for _, (nxt, _) in zip(range(max_gen), steps):
            for r, (_, _, until, _) in enumerate(group):
                if done[r]:
                    continue
                tok = int(nxt[r])
                if tok == self._eos_id:
                    done[r] = True
                    continue
                generated[r].append(tok)
                if until and any(s in self.tok_decode(generated[r]) for s in until):
                    done[r] = True
            if all(done):
                break
        texts = []
        for (_, _, until, _), ids in zip(group, generated):
            text = self.tok_decode(ids)
            cut = min((text.index(s) for s in until if s in text), default=len(text))
            texts.append(text[:cut])
        return texts

