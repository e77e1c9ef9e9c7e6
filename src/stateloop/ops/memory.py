"""The planned peak GPU memory of one training process (``stateloop plan``, and the config check's
gate on ``train.gpu_memory_gib``). Peak = static + activations + loss + allowance, per device:

- **Static**: weights, gradients and AdamW's two moments (4 bytes each under ``bf16-mixed``), DDP's
  buckets with several processes; gradients only where they exist at the peak (``set_to_none``:
  :func:`plan_memory` takes the larger of two instants). FSDP2: :func:`fsdp_static`, checked
  against FSDP2's own allocations (tests/support/fsdp_probe.py: 0.5% under to 19% over them).
- **Activations**: what autograd keeps for backward in one training forward, measured
  (:func:`measure_saved`), then changed by ``train.activation_checkpointing`` (:func:`activations`).
- **Loss**: the cross-entropy's buffers, 12 bytes a logit (:data:`LOSS_BYTES_PER_LOGIT`) over the
  micro-batch or one chunk of ``train.loss_chunk_tokens`` (:func:`loss_bytes`).
- **Allowance**: what ``torch.cuda.max_memory_allocated`` does not show (the allocator's free
  blocks, workspaces, the CUDA context): :data:`ALLOWANCE_GIB` + :data:`ALLOWANCE_FRACTION` of the
  rest ([assume]: not measured here).

Activations are measured on fake tensors at the run's own shapes, with CUDA's fused RMSNorm and,
optionally, mamba_ssm's kernels; decoder-layer applications after the first of a shape are
stand-ins (:class:`_Recorder`); checkpointing runs as training applies it (train/checkpointing.py).
How, why, and the H200 calibration: docs/memory-plan.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from stateloop.config import ConfigError
from stateloop.config.train import CHECKPOINTING
from stateloop.experiments import load_run
from stateloop.files import atomic_write_bytes
from stateloop.models.registry import build_model
from stateloop.ops.measured import cache_dir as _measured_dir
from stateloop.ops.measured import code_digest
from stateloop.runs import resolve_run_arg

GIB = 2**30

# Activations
LOSS_BYTES_PER_LOGIT = 12  # float32 log-softmax output (kept) + the NLL's gradient + the log-softmax's gradient

# Allowance for what max_memory_allocated does not show ([assume]; module docstring)
ALLOWANCE_GIB = 1.5  # CUDA context, cuBLAS and NCCL workspaces
ALLOWANCE_FRACTION = 0.08  # the allocator's free reserved blocks (~3%) + the H200 record's unexplained 4.5%


# ----------------------------------------------------------------------------------------------
# Precision


def parameter_bytes(precision: str) -> int:
    """Bytes of one parameter (and of its gradient and each AdamW moment) under ``precision``."""
    if precision.endswith("-true") and precision.startswith(("bf16", "16")):
        return 2
    return 8 if precision == "64-true" else 4


def compute_dtype(precision: str):
    """(autocast dtype or None, the model's dtype) of a training forward under ``precision``;
    ``auto`` is taken as a GPU's, bf16-mixed."""
    import torch

    return {
        "auto": (torch.bfloat16, torch.float32), "bf16-mixed": (torch.bfloat16, torch.float32),
        "16-mixed": (torch.float16, torch.float32), "32-true": (None, torch.float32),
        "bf16-true": (None, torch.bfloat16), "16-true": (None, torch.float16), "64-true": (None, torch.float64),
    }[precision]


# ----------------------------------------------------------------------------------------------
# Measurement


@dataclass(frozen=True)
class SavedProfile:
    """What one training forward (model only, the loss excluded) keeps for backward, in bytes, at one
    (micro-batch, sequence length, precision); parameters excluded. Every figure is measured
    (:func:`measure_saved`), the parts per unit of activation checkpointing among them."""

    micro_batch: int
    seq_len: int
    total: int  # every distinct storage kept
    copies: int  # of which: low-precision copies of parameters (autocast's weight casts)
    layer_apps: int  # decoder-layer applications (looped stack and unique stacks)
    layer_bytes: int  # kept inside them: activations and inputs, copies excluded
    layer_inputs: int  # the inputs of all of them (the units of 'layer' checkpointing)
    layer_max: int  # the most one application keeps (activations + input)
    layer_copies: int  # copies of decoder-layer weights
    layer_copies_max: int  # of one layer
    loop_apps: int  # applications of the looped stack (K)
    unit_bytes: int  # kept inside the units of 'iteration' checkpointing (every loop iteration, every unique stack)
    unit_inputs: int  # their inputs
    unit_max: int  # the most one such unit keeps
    unit_copies: int  # copies of weights used inside them
    loop_app_bytes: int  # the most one application of the looped stack keeps (what is freed after its backward)
    logits: int  # logits of the micro-batch (B x T x V)
    logit_itemsize: int  # bytes of one logit
    first_use: tuple = ()  # (fraction of the forward's layer applications before a parameter's first use, its count)
    # Measured with activation checkpointing applied (train/checkpointing.py), where
    # it has it; 0: not measured (activations() then derives the level from the figures above)
    kept_layer: int = 0  # everything kept under 'layer'
    copies_layer: int = 0  # of which weight copies (those made outside every unit)
    recompute_layer: int = 0  # the most one 'layer' unit keeps when backward recomputes it (its weight copies too)
    kept_iteration: int = 0
    copies_iteration: int = 0
    recompute_iteration: int = 0


class _FusedRMSNorm:
    """Built lazily (torch): ``F.rms_norm`` keeping what CUDA's fused kernel keeps for backward."""

    fn = None

    @classmethod
    def apply(cls, x, weight, eps):
        if cls.fn is None:
            import torch

            class Fn(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x, weight, eps):
                    rstd = x.new_empty(x.shape[:-1] + (1,), dtype=torch.promote_types(x.dtype, torch.float32))
                    ctx.save_for_backward(x, rstd)  # aten::_fused_rms_norm's backward: input, rstd (and weight)
                    dtype = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
                    return x.new_empty(x.shape, dtype=dtype)

                @staticmethod
                def backward(ctx, grad):  # pragma: no cover - the measurement never runs backward
                    raise RuntimeError("memory measurement: no backward")

            cls.fn = Fn
        return cls.fn.apply(x, weight, eps)


def _cuda_norms():
    """A TorchFunctionMode that sends ``F.rms_norm`` over one trailing dimension with matching dtypes
    (the call CUDA's dispatcher sends to the fused kernel) to :class:`_FusedRMSNorm`."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class CudaNorms(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.any and len(args) == 1 and not kwargs:
                # A data-dependent branch cannot run on fake tensors: the one a training forward
                # takes is trunc_normal_'s rejection loop (Parcae's random initial state), in which
                # nothing is kept for backward; it stops at its first pass.
                return False
            if func is F.rms_norm:
                x, shape = args[0], args[1]
                weight = args[2] if len(args) > 2 else kwargs.get("weight")
                eps = args[3] if len(args) > 3 else kwargs.get("eps")
                if len(shape) == 1 and (weight is None or weight.dtype == x.dtype):
                    return _FusedRMSNorm.apply(x, weight, eps)
            return func(*args, **kwargs)

    return CudaNorms()


@contextlib.contextmanager
def _mamba_kernels():
    """Mamba-2's SSD scan and gated RMSNorm as mamba_ssm's autograd functions keep them (their
    ``ctx.save_for_backward``: the scan's output, x, dt, the float32 dA cumsum per chunk, A, B, C;
    the norm's input, gate and per-group rstd), in place of the twins, for one measurement."""
    import torch

    import stateloop.models.mixers as mixers  # torch: the commands import this module for the gate

    class Measured(torch.autograd.Function):
        @staticmethod
        def backward(ctx, grad):  # pragma: no cover
            raise RuntimeError("memory measurement: no backward")

    class Scan(Measured):
        @staticmethod
        def forward(ctx, x, dt, A, B, C, chunk):
            b, seq, h, _ = x.shape
            out = torch.empty_like(x)
            ctx.save_for_backward(out, x, dt, x.new_empty((b, h, -(-seq // chunk), chunk), dtype=torch.float32), A, B, C)
            return out

    class GatedNorm(Measured):
        @staticmethod
        def forward(ctx, y, z, weight, group_size):
            ctx.save_for_backward(y, z, y.new_empty(y.shape[:-1] + (y.shape[-1] // group_size,), dtype=torch.float32))
            return torch.empty_like(y)

    def ssd(x, dt, A, B, C, chunk_size, impl="auto", initial_state=None, return_final_state=False):
        if initial_state is not None or return_final_state:
            raise RuntimeError("memory measurement: the SSD stand-in is for training forwards only")
        return Scan.apply(x, dt, A, B, C, chunk_size)

    def gated_rms_norm(y, z, weight, group_size, eps, impl="auto"):
        return GatedNorm.apply(y, z, weight, group_size)

    for name in ("ssd", "gated_rms_norm"):
        if not hasattr(mixers, name):
            raise RuntimeError(f"memory measurement: models/mixers.py no longer calls {name}; update ops/memory.py")
    saved = mixers.ssd, mixers.gated_rms_norm
    mixers.ssd, mixers.gated_rms_norm = ssd, gated_rms_norm
    try:
        yield
    finally:
        mixers.ssd, mixers.gated_rms_norm = saved


@contextlib.contextmanager
def _default_dtype(dtype):
    """Parameters made in ``dtype`` (Fabric's ``*-true`` precisions build the model so)."""
    import torch

    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


_PARAM_PATH = {"ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
               "ExpandBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1", "SliceBackward0",
               "SelectBackward0", "AliasBackward0", "UnsafeViewBackward0", "CloneBackward0"}


def _is_param_copy(t) -> bool:
    """Whether ``t`` is a parameter seen through casts and views only (autocast's weight copies)."""
    fn = t.grad_fn
    for _ in range(6):
        if fn is None:
            return False
        if fn.name() == "torch::autograd::AccumulateGrad":
            return True
        if fn.name() not in _PARAM_PATH:
            return False
        nexts = [f for f, _ in fn.next_functions if f is not None]
        if len(nexts) != 1:
            return False
        fn = nexts[0]
    return False


@dataclass(eq=False)
class _Frame:
    kind: str  # "layer" or "unit"
    input_id: int | None = None
    input_bytes: int = 0
    kept: int = 0  # activations and inputs kept inside
    copies: int = 0
    external: set = field(default_factory=set)  # storages of what a layer was handed beside its input


def _tensor_storages(args, kwargs) -> set:
    """Addresses of the storages of the tensors among ``args`` and ``kwargs`` and their attributes
    (RoPE's ``Rotary`` holds its tables as attributes)."""
    import torch

    out = set()
    for a in list(args) + list(kwargs.values()):
        for t in [a, *vars(a).values()] if hasattr(a, "__dict__") and not isinstance(a, torch.Tensor) else [a]:
            if isinstance(t, torch.Tensor):
                out.add(t.untyped_storage()._cdata)
    return out


@dataclass
class _LayerMemo:
    kept: int  # what one application keeps, its input included when it keeps it
    input_kept: bool
    copies: int  # the copies of its weights (first application of a layer instance only)
    out_dtype: object


# Decoder-layer applications already measured, by (layer shapes, input shape and dtype, autocast):
# shared by every measurement of the process (the paper's ten 1.4B models have one layer shape).
_LAYER_MEMO: dict[tuple, _LayerMemo] = {}


class _Recorder:
    """The saved-tensors hook of one measurement and the stand-ins of decoder-layer applications.

    Units of 'iteration' checkpointing, as train/checkpointing.py makes them: every application of a
    stack of decoder layers (``Backbone``) opens one; a unique stack's closes with it, the looped
    stack's stays open over the iteration's work beside it (cell, mixer, read) until the next
    stack, or the final norm, starts. A unit's inputs: the stack's input and the state the cell
    reads."""

    def __init__(self, model):
        from stateloop.models.backbone import Backbone, Layer  # torch: see _mamba_kernels

        self.params = {p.untyped_storage()._cdata for p in model.parameters()}
        # storages counted, by address; each held (``alive``) so that no later storage reuses an address
        self.seen: dict[int, int] = {}
        self.alive: list = []
        self.total = self.copies = 0
        self.frames: list[_Frame] = []  # open: the layer being applied, the unit it is in
        self.unit: _Frame | None = None
        self.units: list[_Frame] = []
        self.layer_apps = self.layer_kept = self.layer_inputs = self.layer_max = 0
        self.layer_copies = self.layer_copies_max = 0
        self.loop_apps = self.loop_app_max = 0
        self.called: set[int] = set()  # layer instances already applied (their weight copies exist)
        self.first_use: dict[int, int] = {}  # id(parameter) -> layer applications before its first use
        self.loop = model.backbone
        inside_layers = {id(m) for layer in model.modules() if isinstance(layer, Layer) for m in layer.modules()}
        self._hooks = []
        self.layers = []
        for module in model.modules():
            if isinstance(module, Layer):
                module.forward = self._layer_forward(module, module.forward)
                self.layers.append(module)
            elif isinstance(module, Backbone):
                self._hooks += [module.register_forward_pre_hook(self._stack_pre),
                                module.register_forward_hook(self._stack_post)]
            if id(module) not in inside_layers and any(True for _ in module.parameters(recurse=False)):
                self._hooks.append(module.register_forward_pre_hook(self._use))
        self._hooks.append(model.norm_f.register_forward_pre_hook(lambda m, a: self._close_unit()))
        self.pack_fn = self.pack  # the hook as registered: stand-ins add bytes only while it is the active one
        cell = getattr(model, "cell", None)
        if cell is not None:
            self._hooks.append(cell.register_forward_pre_hook(self._cell_pre))

    # -- the saved-tensors hook ----------------------------------------------------------------
    def pack(self, t):
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.params or key in self.seen:
            return t
        nbytes = storage.nbytes()
        self.seen[key] = nbytes
        self.alive.append(storage)
        copy = _is_param_copy(t)
        if self.frames and key in self.frames[-1].external:
            # a tensor the layer was handed beside its input (RoPE's tables): made outside it and
            # counted once, never as part of the application (its stand-ins would repeat it)
            self.total += nbytes
            return t
        self._add(nbytes, copy)
        if not copy and self.frames and self.frames[-1].input_id == key:
            self.frames[-1].input_bytes = nbytes
        return t

    def _add(self, nbytes: int, copy: bool) -> None:
        self.total += nbytes
        if copy:
            self.copies += nbytes
        for frame in self.frames + ([self.unit] if self.unit is not None else []):
            if copy:
                frame.copies += nbytes
            else:
                frame.kept += nbytes

    # -- first uses of parameters (when their gradients are final in backward) ------------------
    def _use(self, module, args):
        for p in module.parameters(recurse=False):
            self.first_use.setdefault(id(p), self.layer_apps)

    # -- units of 'iteration' checkpointing ------------------------------------------------------
    def _stack_pre(self, module, args):
        self._close_unit()
        self.unit = _Frame("unit", input_bytes=args[0].untyped_storage().nbytes())
        if module is self.loop:
            self.loop_apps += 1

    def _stack_post(self, module, args, output):
        if module is self.loop:
            self.loop_app_max = max(self.loop_app_max, self.unit.kept)
        else:
            self._close_unit()

    def _cell_pre(self, module, args):
        if self.unit is not None and args and hasattr(args[0], "untyped_storage"):
            self.unit.input_bytes += args[0].untyped_storage().nbytes()  # the state S^k the iteration reads

    def _close_unit(self) -> None:
        if self.unit is not None:
            self.units.append(self.unit)
            self.unit = None

    def close(self) -> None:
        self._close_unit()
        for h in self._hooks:
            h.remove()
        for layer in self.layers:
            del layer.forward  # the class's forward again

    def active(self) -> bool:
        """Whether what is saved now reaches this hook (not a checkpoint unit's own)."""
        import torch

        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        return top is not None and top[0] is self.pack_fn

    # -- decoder layers: measured once per shape, then stand-ins --------------------------------
    def _layer_forward(self, layer, forward):
        import torch

        shapes = tuple((tuple(p.shape), p.dtype) for p in layer.parameters())

        def wrapped(x, *args, **kwargs):
            key = (shapes, tuple(x.shape), x.dtype, torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                   tuple(tuple(a.positions.shape) for a in args if hasattr(a, "positions")))
            first_of_instance = id(layer) not in self.called
            self.called.add(id(layer))
            for p in layer.parameters():
                self.first_use.setdefault(id(p), self.layer_apps)
            memo = None if kwargs else _LAYER_MEMO.get(key)
            xstore = x.untyped_storage()
            active = self.active()
            if not active:  # inside a checkpoint unit: nothing it does reaches this hook
                return forward(x, *args, **kwargs) if memo is None else (
                    x.clone() if x.dtype == memo.out_dtype else x.to(memo.out_dtype))
            if memo is None:  # measured: the real application under the hook
                frame = _Frame("layer", input_id=xstore._cdata, external=_tensor_storages(args, kwargs))
                self.frames.append(frame)
                try:
                    out = forward(x, *args, **kwargs)
                finally:
                    self.frames.pop()
                memo = _LayerMemo(frame.kept, frame.input_bytes > 0, frame.copies, out.dtype)
                if first_of_instance and not kwargs:
                    _LAYER_MEMO[key] = memo
                copies = frame.copies
            else:  # a stand-in: the bytes the measured application kept, and a new output storage
                copies = memo.copies if first_of_instance else 0
                kept = memo.kept
                if memo.input_kept:
                    kept -= xstore.nbytes()
                    if xstore._cdata not in self.params and xstore._cdata not in self.seen:
                        self.seen[xstore._cdata] = xstore.nbytes()
                        self.alive.append(xstore)
                        self._add(xstore.nbytes(), False)
                self._add(kept, False)
                self._add(copies, True)
                out = x.clone() if x.dtype == memo.out_dtype else x.to(memo.out_dtype)
            whole = memo.kept if memo.input_kept else memo.kept + xstore.nbytes()
            self.layer_apps += 1
            self.layer_kept += memo.kept
            self.layer_inputs += xstore.nbytes()
            self.layer_max = max(self.layer_max, whole)
            self.layer_copies += copies
            self.layer_copies_max = max(self.layer_copies_max, copies)
            return out

        return wrapped


def _model_key(cfg) -> str:
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=repr)


def _code_digest() -> str:
    """sha256 of the code a measurement depends on: the models, this module and torch's version
    (ops/measured.py; a cached measurement is used only while they are unchanged)."""
    return code_digest("ops/memory.py", "train/checkpointing.py")


def cache_dir() -> Path | None:
    """Where measurements are kept between processes (ops/measured.py): ``$STATELOOP_CACHE/memory``
    (empty: none), else ``$XDG_CACHE_HOME/stateloop/memory`` (``~/.cache``)."""
    return _measured_dir("memory")


_MEASURED: dict[str, dict] = {}


def measure_saved(model_cfg, micro_batches, seq_len: int, precision: str = "bf16-mixed",
                  mamba_kernels: bool = False) -> list[dict]:
    """What one training forward of ``model_cfg`` keeps for backward at each of ``micro_batches``
    (an int or a list), the loss excluded: :class:`SavedProfile`'s fields and the parameter counts
    by role (``params``). Kept per argument set and code digest, in this process and in
    :func:`cache_dir`, so that a config checked again costs no measurement."""
    mbs = [micro_batches] if isinstance(micro_batches, int) else list(micro_batches)
    keys = {}
    for mb in mbs:
        ident = json.dumps([_model_key(model_cfg), mb, seq_len, precision, mamba_kernels, _code_digest()])
        keys[mb] = hashlib.sha256(ident.encode()).hexdigest()[:32]
    folder = cache_dir()
    for mb, key in keys.items():
        if key not in _MEASURED and folder is not None:
            with contextlib.suppress(OSError, ValueError):
                _MEASURED[key] = json.loads((folder / f"{key}.json").read_text())
    todo = [mb for mb, key in keys.items() if key not in _MEASURED]
    if todo:
        for mb, found in zip(todo, _measure(model_cfg, todo, seq_len, precision, mamba_kernels)):
            _MEASURED[keys[mb]] = found
            if folder is not None:
                with contextlib.suppress(OSError):
                    folder.mkdir(parents=True, exist_ok=True)
                    atomic_write_bytes(folder / f"{keys[mb]}.json", json.dumps(found).encode())
    return [dict(_MEASURED[keys[mb]]) for mb in mbs]


def _fake_model(model_cfg, precision: str):
    """(the model of ``model_cfg`` at full size on fake CPU tensors in the parameters' dtype of
    ``precision``, its fake tensor mode)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = dataclasses.replace(model_cfg, attn_impl="torch", ssd_impl="torch")
    mode = FakeTensorMode()
    with mode, _default_dtype(compute_dtype(precision)[1]):
        model = build_model(cfg, device="cpu", init=False).train()
    return model, mode


def _measure(model_cfg, micro_batches: list[int], T: int, precision: str, mamba_kernels: bool) -> list[dict]:
    import warnings

    import torch

    from stateloop.models.backbone import Layer  # torch: see _mamba_kernels
    from stateloop.train.checkpointing import checkpointed  # torch

    autocast_dtype = compute_dtype(precision)[0]
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FakeTensor's notes
        model, mode = _fake_model(model_cfg, precision)
        layers = [m for m in model.modules() if isinstance(m, Layer)]
        loop = sum(p.numel() for p in model.backbone.parameters())
        sizes = [sum(p.numel() for p in m.parameters()) for m in layers]
        total = sum(p.numel() for p in model.parameters())
        params = {"total": total, "loop": loop, "unique_layers": sum(sizes) - loop, "unit_max": max(sizes, default=0),
                  "root": total - sum(sizes)}
        def run(B, level):
            rec = _Recorder(model)
            autocast = (torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None
                        else contextlib.nullcontext())
            try:
                # the units wrap the recorder's layer stand-ins (train/checkpointing.py), as they ran
                with checkpointed(model, level), mode, _cuda_norms(), \
                        (_mamba_kernels() if mamba_kernels else contextlib.nullcontext()):
                    idx = torch.zeros(B, T, dtype=torch.long)
                    with torch.autograd.graph.saved_tensors_hooks(rec.pack_fn, lambda t: t), autocast:
                        logits = model(idx).logits
            finally:
                rec.close()
            return rec, logits

        for B in micro_batches:
            rec, logits = run(B, "none")
            levels_measured = {}
            for level in CHECKPOINTING[1:]:
                other, _ = run(B, level)
                # a unit backward recomputes: the largest of the level's units, as the forward without
                # checkpointing kept them (a decoder layer and a stack run as units only when live)
                alone = rec.layer_max + rec.layer_copies_max if level == "layer" else max(
                    (u.kept + u.copies for u in rec.units), default=0)
                levels_measured.update({f"kept_{level}": other.total, f"copies_{level}": other.copies,
                                        f"recompute_{level}": alone})
            apps = max(rec.layer_apps, 1)
            first_use: dict[float, int] = {}
            for p in model.parameters():
                f = round(rec.first_use.get(id(p), 0) / apps, 6)  # never seen by a hook (used through F.linear): 0, final last
                first_use[f] = first_use.get(f, 0) + p.numel()
            units = rec.units
            out.append({
                "micro_batch": B, "seq_len": T, "total": rec.total, "copies": rec.copies,
                "layer_apps": rec.layer_apps, "layer_bytes": rec.layer_kept, "layer_inputs": rec.layer_inputs,
                "layer_max": rec.layer_max, "layer_copies": rec.layer_copies, "layer_copies_max": rec.layer_copies_max,
                "loop_apps": rec.loop_apps, "unit_bytes": sum(u.kept for u in units),
                "unit_inputs": sum(u.input_bytes for u in units), "unit_max": max((u.kept for u in units), default=0),
                "unit_copies": sum(u.copies for u in units), "loop_app_bytes": rec.loop_app_max,
                "logits": logits.numel(), "logit_itemsize": logits.element_size(),
                "first_use": [list(x) for x in sorted(first_use.items())], "params": params, **levels_measured,
            })
            del logits
    return out


def measure_saved_full(model_cfg, micro_batch: int, seq_len: int, precision: str = "bf16-mixed") -> int:
    """The same total as :func:`measure_saved`, with every decoder-layer application run for real
    (no stand-ins): the check of the stand-ins (seconds at full size)."""
    import warnings

    import torch

    autocast_dtype = compute_dtype(precision)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, mode = _fake_model(model_cfg, precision)
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        seen: dict[int, int] = {}
        alive = []

        def pack(t):
            s = t.untyped_storage()
            if s._cdata not in params and s._cdata not in seen:
                seen[s._cdata] = s.nbytes()
                alive.append(s)
            return t

        autocast = (torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None
                    else contextlib.nullcontext())
        with mode, _cuda_norms():
            idx = torch.zeros(micro_batch, seq_len, dtype=torch.long)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
                model(idx)
    return sum(seen.values())


def saved_profile(model_cfg, micro_batch: int, seq_len: int, precision: str = "bf16-mixed",
                  mamba_kernels: bool = False) -> SavedProfile:
    """:func:`measure_saved` at any micro-batch from the measurements at micro-batch 1 and 2: every
    figure is affine in the micro-batch (activations per sequence; weight copies and RoPE's tables
    fixed), so the plan compares micro-batches 1 to 8 from two measurements."""
    one, two = measure_saved(model_cfg, [1, 2], seq_len, precision, mamba_kernels)
    fixed = ("seq_len", "layer_apps", "loop_apps", "logit_itemsize", "first_use")
    out = {f.name: one.get(f.name, 0) + (two.get(f.name, 0) - one.get(f.name, 0)) * (micro_batch - 1)
           for f in dataclasses.fields(SavedProfile) if f.name not in (*fixed, "micro_batch")}
    return SavedProfile(**out, **{k: one[k] for k in fixed[:-1]}, micro_batch=micro_batch,
                        first_use=tuple(tuple(x) for x in one["first_use"]))


# ----------------------------------------------------------------------------------------------
# Parameters by role


@dataclass(frozen=True)
class ParamCounts:
    total: int
    loop: int  # the looped stack's decoder layers (FSDP units applied K times)
    unique_layers: int  # decoder layers of unique stacks (FSDP units applied once)
    unit_max: int  # the largest decoder layer
    root: int  # everything else: embedding, head, norms, the state branch (FSDP's root unit)


def param_counts(model_cfg, seq_len: int = 1, precision: str = "bf16-mixed") -> ParamCounts:
    """Parameters of ``model_cfg`` by role (counted on the measurement's model)."""
    return ParamCounts(**measure_saved(model_cfg, [1, 2], seq_len, precision)[0]["params"])


# ----------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class Setting:
    """How a run trains, as far as memory and time depend on it (the keys of ``train:``)."""

    strategy: str = "ddp"  # ddp | fsdp
    fsdp_sharding: str = "full"
    micro_batch: int = 4
    activation_checkpointing: str = "none"
    loss_chunk_tokens: int = 0
    devices: int = 1
    num_nodes: int = 1
    precision: str = "bf16-mixed"
    accumulation: int = 1

    @classmethod
    def of(cls, tcfg, **changes) -> Setting:
        s = cls(tcfg.strategy, tcfg.fsdp_sharding, tcfg.micro_batch, tcfg.activation_checkpointing,
                tcfg.loss_chunk_tokens, tcfg.devices, tcfg.num_nodes, tcfg.precision, tcfg.accumulation)
        s = dataclasses.replace(s, **changes)
        if "micro_batch" in changes and "accumulation" not in changes:
            s = dataclasses.replace(s, accumulation=max(1, tcfg.global_batch // (s.micro_batch * s.world)))
        return s

    @property
    def world(self) -> int:
        return self.devices * self.num_nodes

    @property
    def sharded(self) -> bool:
        """FSDP with several processes (a single device uses no wrapper: train/loop.py)."""
        return self.strategy == "fsdp" and self.world > 1

    @property
    def shard_group(self) -> int:
        return self.devices if self.fsdp_sharding.startswith("hybrid") else self.world

    @property
    def kind(self) -> str:
        """"1 GPU" (nothing to shard or reduce, whatever ``strategy`` says), "ddp" or "fsdp"."""
        return "1 GPU" if self.world == 1 else self.strategy

    @property
    def label(self) -> str:
        strat = f"fsdp:{self.fsdp_sharding}" if self.kind == "fsdp" else self.kind
        chunk = f" loss/{self.loss_chunk_tokens}" if self.loss_chunk_tokens else ""
        return f"{strat} mb{self.micro_batch} ckpt:{self.activation_checkpointing}{chunk}"


@dataclass(frozen=True)
class MemoryPlan:
    """Planned peak memory of one device, in bytes, by term (module docstring)."""

    static: int  # weights, gradients and optimizer state as they stand at the peak (+ DDP buckets / FSDP units)
    activations: int  # kept for backward (and, with checkpointing, the recomputation) at the peak
    loss: int  # the cross-entropy's buffers
    allowance: int
    instant: str  # which instant is the peak: "backward start" or "after the first stack's backward" or "forward"

    @property
    def allocated(self) -> int:
        """The peak of allocated memory: what ``torch.cuda.max_memory_allocated`` would show."""
        return self.static + self.activations + self.loss

    @property
    def total(self) -> int:
        return self.allocated + self.allowance

    @property
    def gib(self) -> float:
        return self.total / GIB


def loss_bytes(profile: SavedProfile, chunk_tokens: int = 0, logits_kept: bool = False) -> int:
    """The loss's buffers at the start of backward (module docstring): 12 bytes a logit over the
    micro-batch's logits, or over one chunk of ``chunk_tokens`` tokens; plus the logits themselves
    where the caller keeps them (``logits_kept``)."""
    vocab = profile.logits // (profile.micro_batch * profile.seq_len) if profile.logits else 0
    tokens = profile.micro_batch * profile.seq_len
    n = min(chunk_tokens, tokens) * vocab if chunk_tokens > 0 else profile.logits
    return n * (LOSS_BYTES_PER_LOGIT + (profile.logit_itemsize if logits_kept else 0))


@dataclass(frozen=True)
class Activations:
    """Activation terms of one checkpointing level, in bytes (:func:`activations`)."""

    kept: int  # kept for backward when the forward ends
    recompute: int  # at most alive at once while backward recomputes a unit (0 without checkpointing)
    forward_extra: int  # beyond ``kept`` at the forward's own peak
    freed_first: int  # freed once backward has passed the last application of the looped stack


def activations(p: SavedProfile, checkpointing: str) -> Activations:
    """The activation terms for a checkpointing level, from the measured profile ``p``: ``none``
    keeps everything measured; a level measured live (``kept_<level>``) keeps that, and backward
    recomputes its largest unit with the weight copies autocast makes again for it (its cache
    empties when the forward ends); otherwise the level is derived from the forward without it,
    each unit keeping only its inputs. The forward's own peak holds every weight copy and one
    decoder layer at work."""
    if checkpointing == "none":
        return Activations(p.total, 0, 0, p.loop_app_bytes)
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {', '.join(CHECKPOINTING)}; got {checkpointing!r}")
    measured = getattr(p, f"kept_{checkpointing}")
    if measured:
        outside = getattr(p, f"copies_{checkpointing}")
        kept, recompute = measured - outside, getattr(p, f"recompute_{checkpointing}")
    elif checkpointing == "layer":
        kept = p.total - p.copies - p.layer_bytes + p.layer_inputs
        outside = p.copies - p.layer_copies
        recompute = p.layer_max + p.layer_copies_max
    else:
        kept = p.total - p.copies - p.unit_bytes + p.unit_inputs
        outside = p.copies - p.unit_copies
        recompute = p.unit_max + p.unit_copies // max(p.loop_apps, 1)
    kept += outside
    forward_extra = p.copies - outside + p.layer_max
    return Activations(kept, recompute, forward_extra, 0)


# FSDP2 (train/parallel.py), per unit of sharding: a gathered unit holds its unsharded parameters
# and, until the next all-gather's copy-out, the flat all-gather output they were copied from
# (torch/distributed/fsdp/_fully_shard: FSDPParamGroup.wait_for_unshard keeps all_gather_state).
GATHERED_UNIT = 2  # x a unit's parameter bytes: its unsharded parameters + the all-gather output


def fsdp_static(n: ParamCounts, setting: Setting, embedding: int) -> tuple[int, int]:
    """Parameter, gradient and optimizer bytes of one device under FSDP2 (train/parallel.py: every
    decoder layer a unit, the root the rest; float32 gathered and reduced) at the two instants of
    :func:`plan_memory`. With p the parameters' bytes, S the shard group, U the largest unit, R the
    root, E the token embedding (``embedding``; its gradient comes last):

    - always: the shards of the weights and both moments, 3 p P / S;
    - start: the root, gathered again (p R), the first unit prefetched (2 p U: :data:`GATHERED_UNIT`);
      ``grad_op``: every layer still gathered from its forward and the last all-gather's output;
      accumulation: the earlier micro-batches' unsharded gradients (p P);
    - after: the root and its gradients but E's, the looped units' gradients summed over their K
      applications (in the compute dtype), the next unit prefetched, the reduce-scatter in flight
      (p U (1 + 1/S)), the unique stacks' gradient shards; ``grad_op`` as at the start (an upper
      bound); accumulation: the root's and unique stacks' earlier gradients, the looped units' as
      shards (FSDP2 reduces them at a unit's first post-backward)."""
    pb = parameter_bytes(setting.precision)
    low = pb if setting.precision in ("32-true", "64-true") or not setting.precision.endswith("mixed") else 2
    S, U = setting.shard_group, n.unit_max
    grad_op = setting.fsdp_sharding in ("grad_op", "hybrid_grad_op")
    accumulating = setting.accumulation > 1
    sharded = 3 * pb * n.total // S
    start = sharded + (pb * n.total + pb * U if grad_op else pb * n.root + GATHERED_UNIT * pb * U)
    if accumulating:
        start += pb * n.total
    after = sharded + pb * n.root + pb * U + pb * U // S + pb * n.unique_layers // S
    after += pb * (n.loop + n.unique_layers) + pb * U if grad_op else GATHERED_UNIT * pb * U
    after += low * n.loop
    if accumulating:
        after += pb * (n.root + n.unique_layers) + pb * n.loop // S
    else:
        after += pb * max(0, n.root - embedding)
    return start, after


def plan_memory(model_cfg, seq_len: int, setting: Setting, profile: SavedProfile | None = None,
                logits_kept: bool = False, mamba_kernels: bool = False, params: ParamCounts | None = None) -> MemoryPlan:
    """The planned peak memory of one device for a run of ``model_cfg`` trained as ``setting``: the
    larger of two instants, the start of backward (the forward's end, with the loss's buffers; or
    the forward's own peak under checkpointing) and the moment backward has passed the last
    application of the looped stack (every gradient, and under FSDP every looped unit, exists by
    then; that application's activations are freed)."""
    p = profile or saved_profile(model_cfg, setting.micro_batch, seq_len, setting.precision, mamba_kernels)
    n = params or param_counts(model_cfg, seq_len, setting.precision)
    pb = parameter_bytes(setting.precision)
    loss = loss_bytes(p, setting.loss_chunk_tokens, logits_kept)
    accumulating = setting.accumulation > 1  # earlier micro-batches' gradients exist from the start
    a = activations(p, setting.activation_checkpointing)
    if not setting.sharded:
        weights_moments = 3 * pb * n.total
        buckets = pb * n.total if setting.world > 1 else 0
        start_static = weights_moments + buckets + (pb * n.total if accumulating else 0)
        after_static = weights_moments + buckets + pb * n.total
    else:
        start_static, after_static = fsdp_static(n, setting, model_cfg.vocab_size * model_cfg.d_model)
    candidates = [
        # the loss's buffers are freed before backward reaches the first unit to recompute
        MemoryPlan(start_static, a.kept, loss, 0, "backward start") if loss >= a.recompute
        else MemoryPlan(start_static, a.kept + a.recompute, 0, 0, "backward start"),
        MemoryPlan(after_static, a.kept - a.freed_first + a.recompute, 0, 0, "in backward"),
    ]
    if a.forward_extra:
        candidates.append(MemoryPlan(start_static, a.kept + a.forward_extra, 0, 0, "forward"))
    peak = max(candidates, key=lambda m: m.allocated)
    return dataclasses.replace(peak, allowance=int(ALLOWANCE_GIB * GIB + ALLOWANCE_FRACTION * peak.allocated))


# ----------------------------------------------------------------------------------------------
# The gate


def _fix_hint(setting: Setting) -> str:
    hints = []
    if setting.micro_batch > 1:
        hints.append("lower micro_batch")
    if setting.activation_checkpointing != "iteration":
        hints.append("set activation_checkpointing (layer or iteration)")
    if not setting.loss_chunk_tokens:
        hints.append("set loss_chunk_tokens")
    if not setting.sharded and setting.world > 1:
        hints.append("use strategy fsdp")
    hints.append("or use more memory per device")
    return ", ".join(hints[:-1]) + (" " if len(hints) > 1 else "") + hints[-1]


def gate(cfg, runs, where: str = "config") -> None:
    """The memory gate, asked for by who submits or runs training (workflow/rules/common.smk, the
    commands): :func:`check_fit` where a scale sets ``train.gpu_memory_gib``; the other scales
    cost nothing (no torch, no model)."""
    if any(scale.train.gpu_memory_gib for scale in cfg.scales.values()):
        check_fit(cfg, runs, where)


def gate_run(path, run: str) -> None:
    """:func:`gate` and :func:`check_host` of one run of the config file ``path``, ``run`` as
    ``stateloop train`` takes it (a run id or its folder): the training command asks for them
    before it trains."""
    run_id = resolve_run_arg(run).id
    if run_id is not None:  # a folder that names no run: the stage refuses it in its own words
        cfg, planned = load_run(path, run_id)
        gate(cfg, [planned], str(path))
        check_host(cfg, planned, str(path))


def available_host_bytes() -> int | None:
    """The memory this machine has available now (``MemAvailable`` of /proc/meminfo), in bytes;
    None where that is not known (no /proc: not judged)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _on_cpu(accelerator: str) -> bool:
    if accelerator == "auto":
        import torch

        return not torch.cuda.is_available()
    return accelerator == "cpu"


def check_host(cfg, run, where: str = "config") -> None:
    """Refuse, in one line, a training on the CPU (``train.accelerator`` cpu, or auto without a GPU)
    whose planned memory exceeds what this machine has available: :func:`plan_memory` per process
    (allowance included) times the processes of one node (``train.devices``), against
    :func:`available_host_bytes`. Not judged where that is unknown, nor in a node's later
    processes (their first has judged for them, and their own start has taken memory since)."""
    tcfg = cfg.scales[run.scale].train
    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID") or "0"
    if local != "0" or not _on_cpu(tcfg.accelerator):
        return
    available = available_host_bytes()
    if available is None:
        return
    precision = "32-true" if tcfg.precision == "auto" else tcfg.precision  # as train/loop.py resolves it on the CPU
    n = tcfg.devices  # processes on this node

    def plan(**changes) -> MemoryPlan:
        return plan_memory(run.model_config, tcfg.seq_len, Setting.of(tcfg, precision=precision, **changes))

    planned = plan().total * n
    if planned <= available:
        return
    procs = f"{n} processes x {planned / n / GIB:.1f} GiB, " if n > 1 else ""
    fitting = next((mb for mb in range(tcfg.micro_batch - 1, 0, -1) if plan(micro_batch=mb).total * n <= available), None)
    static = (plan(micro_batch=1).static * (1 + ALLOWANCE_FRACTION) + ALLOWANCE_GIB * GIB) * n
    if fitting is not None:
        fix = f"lower train.micro_batch to {fitting} (accumulation keeps train.global_batch)"
    elif static > available:
        fix = (f"the weights, gradients and optimizer state alone plan ~{static / GIB:.1f} GiB; train a smaller model "
               f"(model.d_model, model.n_layers) or on a GPU")
    else:
        fix = "one sequence does not fit even at micro_batch 1; lower train.seq_len or set train.activation_checkpointing"
    if n > 1:
        fix += ", or use fewer train.devices"
    raise ConfigError(
        f"{where}: scales.{run.scale}.train: {run.id} on the CPU plans ~{planned / GIB:.1f} GiB of memory ({procs}"
        f"micro_batch {tcfg.micro_batch}, {precision}: ops/memory.py) > the {available / GIB:.1f} GiB this machine has "
        f"available (MemAvailable): {fix}")


def check_fit(cfg, runs, where: str = "config") -> None:
    """Refuse, in one line, a config with a run whose planned peak (:func:`plan_memory`, allowance
    included) exceeds its scale's ``train.gpu_memory_gib``: the first such run, its estimate, the
    limit, what to change, and how many runs do not fit. Scales without the key are not checked and
    cost nothing. ``runs``: the config's runs (pipeline.Run), by id or as a list."""
    failed = []
    for run in runs.values() if isinstance(runs, dict) else runs:
        tcfg = cfg.scales[run.scale].train
        if tcfg.gpu_memory_gib <= 0:
            continue
        setting = Setting.of(tcfg)
        plan = plan_memory(run.model_config, tcfg.seq_len, setting)
        if plan.total > tcfg.gpu_memory_gib * GIB:
            failed.append((run, tcfg, setting, plan))
    if failed:
        run, tcfg, setting, plan = failed[0]
        more = f"; {len(failed) - 1} more run(s) do not fit either" if len(failed) > 1 else ""
        key, cause = _cause(run, tcfg, setting, plan)
        raise ConfigError(
            f"{where}: scales.{run.scale}.train.{key}: {run.id} needs ~{plan.gib:.0f} GiB per GPU ({setting.label}) > "
            f"train.gpu_memory_gib {tcfg.gpu_memory_gib:g}: {cause}{more} (stateloop plan --config ... --compare-strategies)")


def _cause(run, tcfg, setting: Setting, plan: MemoryPlan) -> tuple[str, str]:
    """(the key to change, what does not fit and how to change it) for a run over its limit: the
    weights, gradients and optimizer state alone (the memory or the strategy), one sequence of
    ``seq_len`` (the sequence length or checkpointing), else the micro-batch (the largest that fits)."""
    limit = tcfg.gpu_memory_gib * GIB
    gib = lambda b: f"{b / GIB:.0f} GiB"  # noqa: E731
    if plan.static * (1 + ALLOWANCE_FRACTION) + ALLOWANCE_GIB * GIB > limit:
        fix = "use strategy fsdp" if not setting.sharded and setting.world > 1 else "use more devices or more memory per device"
        return "gpu_memory_gib", f"the weights, gradients and optimizer state alone need {gib(plan.static)}; {fix}"
    def at(mb: int) -> Setting:
        return Setting.of(tcfg, micro_batch=mb)

    fitting = [mb for mb in range(setting.micro_batch - 1, 0, -1)
               if plan_memory(run.model_config, tcfg.seq_len, at(mb)).total <= limit]
    others = _fix_hint(at(1))
    if not fitting:
        return "seq_len", f"one sequence of {tcfg.seq_len} tokens does not fit even at micro_batch 1; lower seq_len, {others}"
    return "micro_batch", f"micro_batch {setting.micro_batch} does not fit, {fitting[0]} does; lower it, or {others}"
