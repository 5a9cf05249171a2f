"""Int8Linear: y = x W^T + b with W stored as int8 per output channel, W ~ scale[:, None] * q.

Two modes (compress/quantize.py swaps them in for nn.Linear):

- "dynamic": each call quantises the activations (per row, by its range) and multiplies
  u8 x s8 into int32 (Jacob et al. 2018's scheme, dynamic as in BERT inference on CPU);
- "weight-only": activations are not quantised, only the weights are int8 (decoding reads every
  weight once a token, so the bytes read are the time): w8a32 widens them to fp32 in registers.

Which kernel runs is measured, not assumed. int8 speed depends on the CPU (AVX2 without VNNI
has no u8 x s8 dot instruction; AVX-512 VNNI has), on the shape and on the rows a call has, so
the first call of each (mode, in, out, rows bucket, threads) on this machine times every kernel
that applies on its own input and keeps the fastest (CHOICES; written down for later processes
by quant/kernel_store.py, so outputs do not change from run to run). "fp32" (the dequantised weight
through F.linear) is always a candidate: a layer never runs slower than fp32 by more than timing
noise, and where int8 loses the choice says so (`choices()`). Kernels, guarded (an op missing
from this torch build is simply no candidate):

- "fbgemm": torch.ops.quantized.linear_dynamic on fbgemm's packed weight (AVX2 packing; its
  packed form is built from a per-channel qint8 tensor, whose creation functions torch marks
  deprecated: the build is guarded and lmforge's state is plain int8 + scales either way);
- "onednn": the same op on oneDNN's packed weight (VNNI / AMX code where the CPU has them; 3-20 %
  faster than fbgemm on most MiniLM and bert-base shapes), timed on two lengths in turn (it
  rebuilds a per-shape set-up when the input shape changes);
- "onednn-u8": oneDNN's product on bytes lmforge quantised per row in one pass of native code
  (quant/engines.py, quant/native.py; where gcc can build it);
- "int8pack": aten._weight_int8pack_mm on fp32 activations (weight-only; on x86 a scalar loop);
- "int8pack-bf16": the same op on bfloat16 activations, its vectorised (AVX2 / AVX-512) form: int8
  rows widened in registers, products summed in fp32, the sum rounded to bf16 and scaled in fp32
  (relative error ~0.24 % against the dequantised fp32 product, of the order of int8 rounding
  itself). The kernel loads 16 columns at a time with aligned loads, so only for in % 16 == 0;
- "w8a32" (both modes, at up to 64 rows): the int8 weight, packed once as tiles, widened to fp32 in
  native code against fp32 input (quant/engines.py): decoding's kernel where int8pack-bf16 is slow;
- "u8-vnni" (dynamic, at up to 64 rows, AVX-512 VNNI): rows quantised as for onednn-u8, multiplied by
  lmforge's own VNNI kernel on tiles packed once (quant/engines.py): a text's few rows;
- "dequantise": W rebuilt in fp32 at every call, then F.linear (weight-only; a correct fallback);
- "fp32": a dequantised fp32 copy kept beside the int8 weight, then F.linear.

Each also runs as "<kernel>-serial", on one thread: with few rows, waking a second thread can
cost more than it saves (on cores shared with other work, a whole scheduler slice: ~16 ms). Between
two dynamic layers, an FFN's hidden units may skip their fp32 form altogether (quant/int8_ffn.py).
"""
from __future__ import annotations

import itertools
import threading

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.quant import engines, kernel_store, native
from lmforge.quant.engines import U8, pack_u8, pack_weight
from lmforge.quant.isa import activation_bits, eight_bit_activations, vnni_in_use  # noqa: F401 (vnni_in_use)
from lmforge.quant.scratch import SCRATCH_MIN_BYTES, scratch
from lmforge.utils.timing import Elsewhere, alternating, cold_caches
from lmforge.utils.versions import version

MODES = ("dynamic", "weight-only")
KERNELS = {"dynamic": ("fp32", "fbgemm", "onednn", U8, engines.W8A32, engines.VNNI),
           "weight-only": ("fp32", "int8pack", "int8pack-bf16", "dequantise", engines.W8A32)}
AGREE = 0.1  # a candidate further than this (relative norm) from fp32 is broken, not imprecise: dropped
PINS = torch.tensor([[1.0], [-1.0]])  # the rows under a dynamic product's input (_quantised_rows)
SERIAL = "-serial"  # a kernel's name + SERIAL: the same on one thread (see the module doc)
ROW_BUCKETS = (1, 8, 64, 512)  # a call's rows are timed as the smallest bucket >= them (else "many")
FEW = (1, 8, 64)  # the buckets w8a32 and u8-vnni are candidates at: they read their tiles again per row
COLD = (1, 8)  # decoding's buckets: timed with the caches emptied between calls, as a step meets each layer
CHOICES: dict = {}  # (mode, in, out, bucket, threads) -> kernel, for this process
TIMINGS: dict = {}  # same key -> {kernel: median seconds}, what the choice was made on
_MEASURING = threading.Lock()  # one measurement at a time: threads (a server's workers) meeting a new
# shape together wait for one choice instead of timing kernels against each other


def quantise_per_channel(weight: torch.Tensor) -> tuple:
    """(out, in) fp32 -> (int8 q, (out,) fp32 scale) with q = round(w / scale), scale = max|w_row| / 127
    (symmetric: zero maps to zero; an all-zero row gets scale 1; a load accepts this: int8_checks.py)."""
    w = weight.detach().float()
    if not bool(torch.isfinite(w).all()):  # a NaN row became zeros of scale 1, an inf row zeros: unsaid
        raise ValueError("the weight holds non-finite values (NaN or inf), which int8 cannot hold")
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def stored(key: tuple) -> tuple:
    """The name a choice is kept under on this machine: its key and the kernels this lmforge offers for
    its mode, so a choice made before a kernel was added is measured again, not kept for ever."""
    return (*key, "+".join(KERNELS[key[0]]))


def bucket_of(rows: int):
    """The smallest of ROW_BUCKETS holding `rows`, else "many": the rows a kernel choice is made for."""
    return next((b for b in ROW_BUCKETS if rows <= b), "many")


class Int8Linear(nn.Module):
    """nn.Linear's y = x W^T + b over an int8 per-channel weight (buffers qweight, scale, bias, and
    smooth where SmoothQuant's factors were applied), running the kernel measured fastest for its
    shape on this machine (see the module doc)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, mode: str = "dynamic",
                 smoothed: bool = False) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not one of {', '.join(MODES)}")
        if smoothed and mode != "dynamic":
            raise ValueError(f"smoothing divides quantised activations: mode {mode!r} has none")
        self.in_features, self.out_features, self.mode = in_features, out_features, mode
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        # (in,) SmoothQuant's s: the int8 weight is W * s (columns), the quantised input x / s
        self.register_buffer("smooth", torch.ones(in_features) if smoothed else None)
        self._derived: dict = {}  # kernel -> its packed / fp32 form, valid for `_derived_key`
        self._derived_key = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: str = "dynamic", quantise: bool = True,
                    smooth: torch.Tensor | bool | None = None) -> "Int8Linear":
        """The int8 form of `linear` (its weight quantised per output channel; quantise=False: the
        shapes only, for a checkpoint's weights to be loaded into). smooth: the (in,) positive factors
        s that move the input's outlier channels into the weight, W x = (W s)(x / s) (compress/
        smooth.py), or True with quantise=False: room for them."""
        smoothed = smooth is not None and smooth is not False
        if smoothed and (smooth is True) == quantise:  # factors to apply, or room to load them into
            raise ValueError("smooth: (in,) factors to quantise with, or True with quantise=False")
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, mode, smoothed)
        if not quantise:
            return module.to(linear.weight.device)
        weight = linear.weight.detach()
        if smoothed:
            positive = bool(smooth.isfinite().all() and (smooth > 0).all())
            if tuple(smooth.shape) != (linear.in_features,) or not positive:
                raise ValueError(f"smooth: {linear.in_features} positive finite factors expected, got "
                                 f"shape {tuple(smooth.shape)}")
            smooth = smooth.detach().to(weight.device, torch.float32)
            module.smooth.copy_(smooth)
            weight = weight * smooth
        q, scale = quantise_per_channel(weight)
        module.qweight.copy_(q)
        module.scale.copy_(scale)
        if linear.bias is not None:
            module.bias.copy_(linear.bias.detach())
        return module.to(linear.weight.device)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised (out, in) fp32 weight, a fresh tensor (for code that reads W directly); where
        smoothed, coarser (W s was quantised: bench/FINDINGS.md)."""
        weight = self.qweight.float() * self.scale[:, None]
        return weight if self.smooth is None else weight.div_(self.smooth)

    def extra_repr(self) -> str:
        smoothed = ", smoothed" if self.smooth is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}{smoothed}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled() and x.requires_grad:
            return F.linear(x.float(), self.weight, self.bias).to(x.dtype)  # the reference path
        x2 = x.reshape(-1, self.in_features)
        return self.run(self.kernel_for(x2), x2).view(*x.shape[:-1], self.out_features)

    def key(self, rows: int) -> tuple:
        """(mode, in, out, rows bucket, threads): what a kernel is chosen for (CHOICES)."""
        return self.mode, self.in_features, self.out_features, bucket_of(rows), torch.get_num_threads()

    def kernel_for(self, x: torch.Tensor) -> str:
        """The kernel for (rows, in) fp32 x here: chosen, timed on x, at the first call of its key."""
        key = self.key(x.shape[0])  # _MEASURING is not re-entrant: _measure runs kernels, never a forward
        return kernel_store.chosen(CHOICES, _MEASURING, key, lambda: self._choose(key, x))

    def run(self, kernel: str, x: torch.Tensor) -> torch.Tensor:
        """(rows, in) fp32 -> (rows, out) through the named kernel."""
        if kernel.endswith(SERIAL):
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return self.run(kernel[:-len(SERIAL)], x)
            finally:
                torch.set_num_threads(threads)
        if kernel == "fp32":
            return F.linear(x, self.form("fp32"), self.bias)
        if kernel == "dequantise":
            return F.linear(x, self.weight, self.bias)
        if kernel == "int8pack":
            # the op refuses a strided last dimension (x.T), and a chosen kernel meets every layout
            out = torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.qweight, self.scale)
            return out if self.bias is None else out.add_(self.bias)
        if kernel == "int8pack-bf16":  # scale 1 inside (bf16 would round it), the fp32 scale after
            x = x.to(torch.bfloat16, memory_format=torch.contiguous_format)
            out = torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.form("int8pack-bf16"))
            out = out.float().mul_(self.scale)
            return out if self.bias is None else out.add_(self.bias)
        if kernel == engines.W8A32:  # a smoothed (dynamic) layer's int8 weight is W s: its input x / s
            x = x if self.smooth is None else x / self.smooth
            return self.form(engines.W8A32)(x, self.bias)
        if kernel in (U8, engines.VNNI):  # rows quantised by lmforge's native kernel (quant/engines.py), no
            # buffer, no pins; multiplied by oneDNN (U8) or lmforge's VNNI kernel
            return self.rows_back(*self.form(kernel).product(x, activation_bits()))
        return self._quantised_rows(kernel, x)

    def _quantised_rows(self, kernel: str, x: torch.Tensor) -> torch.Tensor:
        """fbgemm's or oneDNN's dynamic u8 x s8 product with per-row activation scales: both quantise
        a tensor by one range, so each row is first divided by its largest |x| and the output rows
        multiplied back (the product is linear in x). all-MiniLM-L6-v2's embeddings: cosine to
        fp32 0.971 per tensor, 0.990 per row (7-bit), 0.995 per row (8-bit). 7-bit activations
        (reduce_range) unless eight_bit_activations(): a CPU without VNNI (AVX2, AVX-512 before VNNI)
        sums u8 x s8 pairs in int16, which 8-bit activations saturate (errors 20x the bound). A smoothed
        layer divides x by its `smooth` factors first (compress/smooth.py): lowest cosine over 512 GCIDE
        definitions 0.9862 -> 0.9934 with 7 bits, 0.9916 -> 0.9981 with 8 (random-token calibration)."""
        # the scaled input dies in the op: under glibc a large one goes to a reused buffer (quant/scratch.py).
        # Two rows of +1 and -1 below it pin the op's tensor range to [-1, 1]: every row is then quantised
        # alike in any batch (a text alone and in a batch gave 7e-3 apart through the same kernel)
        rows = x.shape[0]
        shape = (rows + 2, self.in_features)
        big = x.numel() * x.element_size() >= SCRATCH_MIN_BYTES
        scaled = scratch("int8-input", shape, x) if big else x.new_empty(shape)
        scaled[rows:].copy_(PINS)
        body = scaled[:rows]
        if self.smooth is not None:  # x / s first: its rows' ranges are the ones quantised
            x = torch.div(x, self.smooth, out=body)
        # (rows, 1) largest |x|, from two reductions: x.abs() would allocate and write a tensor as large as x
        peak = torch.maximum(x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True).neg_())
        peak.clamp_(min=1e-30)
        torch.div(x, peak, out=body)
        out = torch.ops.quantized.linear_dynamic(scaled, self.form(kernel), not eight_bit_activations())
        return self.rows_back(out[:rows], peak)

    def rows_back(self, out: torch.Tensor, peak: torch.Tensor) -> torch.Tensor:
        """The product of row-scaled inputs (rows, out) times each row's peak (rows, 1), plus the bias."""
        if self.bias is None:
            return out.mul_(peak)
        return torch.addcmul(self.bias, out, peak, out=out)  # one pass over the output, not two

    def form(self, kernel: str):
        """The derived weight a kernel reads, rebuilt when the buffers changed (load_state_dict)."""
        buffers = (self.qweight, self.scale, self.smooth)
        key = tuple((t.data_ptr(), version(t)) for t in buffers if t is not None)
        if key != self._derived_key:
            self._derived, self._derived_key = {}, key
        form = self._derived.get(kernel)  # one read: another thread's _measure may drop it meanwhile
        if form is None:
            if kernel == "fp32":
                form = self.weight
            elif kernel == "int8pack-bf16":  # a scale of ones: the fp32 scale is applied after
                form = torch.ones_like(self.scale, dtype=torch.bfloat16)
            elif kernel == U8:
                form = pack_u8(self.qweight, self.scale, self.smooth)
            elif kernel == engines.VNNI:
                form = engines.pack_vnni(self.qweight, self.scale, self.smooth)
            elif kernel == engines.W8A32:
                form = engines.pack_w8a32(self.qweight, self.scale)
            else:
                form = pack_weight(kernel, self.qweight, self.scale)
            self._derived[kernel] = form
        return form

    def release(self, kernel: str) -> None:
        """Drop the derived form `kernel` reads (packed again when next needed)."""
        self._derived.pop(kernel, None)

    def candidates(self, bucket=1) -> list:
        """The kernels of this mode that this torch build offers for calls of the rows `bucket`."""
        usable = []
        for kernel in KERNELS[self.mode]:
            if not engines.usable(kernel) or kernel in (engines.W8A32, engines.VNNI) and bucket not in FEW:
                continue
            if kernel == engines.VNNI and not native.vnni_fits(self.in_features):
                continue
            if kernel.startswith("int8pack") and not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
                continue
            if kernel == "int8pack-bf16" and not self._aligned():
                continue
            usable += [kernel, kernel + SERIAL] if torch.get_num_threads() > 1 else [kernel]
        return usable

    def _aligned(self) -> bool:
        """Whether int8pack-bf16's aligned 16-column loads stay inside rows (in % 16, 64-byte storage)."""
        q = self.qweight
        return self.in_features % 16 == 0 and q.is_contiguous() and q.data_ptr() % 64 == 0

    def _choose(self, key: tuple, x: torch.Tensor) -> str:
        """This machine's kernel for `key`: the one written down before (quant/kernel_store.py) where it
        still agrees with fp32 on x, else the fastest measured now, written down (unless another process
        wrote one first)."""
        known = kernel_store.recall(stored(key))
        runnable = known in self.candidates(key[3])
        if runnable and self._still_agrees(known, x):
            return known
        with Elsewhere() as elsewhere:
            measured = self._measure(key, x)
        if measured == "dequantise" or not runnable and known is not None and \
                known.removesuffix(SERIAL) in KERNELS[self.mode]:
            # the fallback of an input no kernel could run (non-finite) is this call's, not the machine's;
            # a kernel this torch offers but this layer cannot run (int8pack-bf16 unaligned) stays written
            return measured
        return kernel_store.settle(stored(key), measured, stale=known, elsewhere=elsewhere)

    def _still_agrees(self, kernel: str, x: torch.Tensor) -> bool:
        """Whether a kernel written down before still agrees with fp32 on x (a written choice is a speed,
        not a result: a kernel that came to disagree, a changed build or native library, is measured
        again and replaced, never run); x without a finite row judges nothing: it stands."""
        reference = F.linear(x, self.weight, self.bias)
        if not torch.isfinite(reference).all(dim=-1).any():
            return True
        try:
            return agrees(self.run(kernel, x), reference)
        except (RuntimeError, ValueError):  # refusing this shape or build now
            return False

    def _measure(self, key: tuple, x: torch.Tensor) -> str:
        """Time every usable kernel on x that agrees with fp32 on it; keep the fastest (and the times).
        The kernels take turns round by round and each keeps its fastest round: the choice is kept for
        the machine (kernel_store), so a burst of load from elsewhere must not decide it. At decoding's
        row counts (COLD) the caches are emptied before each call: in cache one thread won (w8a32, 768 x
        2304: 0.16 vs 0.25 ms), from memory two do (GPT-2 small's 48 layers: 8.4 vs 5.0 ms a token)."""
        calls, reference = {}, F.linear(x, self.weight, self.bias)
        for kernel in self.candidates(key[3]):
            try:
                if agrees(self.run(kernel, x), reference):
                    call = _alternating(lambda rows, kernel=kernel: self.run(kernel, rows), x)
                    call(), call()  # both of its inputs' shapes run here, where a refusal is caught
                    calls[kernel] = call
            except (RuntimeError, ValueError):  # present but refusing this shape or build: no candidate
                continue
        between = cold_caches() if key[3] in COLD and calls else None  # from memory, not from cache
        times = TIMINGS[key] = alternating(calls, rounds=5, pick=min, between=between) if calls else {}
        best = min(times, key=times.get) if times else "dequantise"  # always correct, needs no op
        for kernel in set(self._derived) - {best.removesuffix(SERIAL)}:
            self._derived.pop(kernel, None)  # an fp32 copy is not kept idle beside the int8 weight
        return best


def _alternating(run, x: torch.Tensor):
    """A call running `run` on x and on x without its first row in turn: a kernel that keeps a set-up
    per input shape (oneDNN's) is timed paying its rebuild, as calls of varying lengths (a server's) do."""
    inputs = [x, x[1:]] if x.shape[0] > 1 else [x]
    turn = itertools.count()
    return lambda: run(inputs[next(turn) % len(inputs)])


def agrees(out: torch.Tensor, reference: torch.Tensor) -> bool:
    """Whether a kernel's output is within AGREE (relative norm) of the fp32 reference on the rows the
    reference has finite (a padding row of NaN says nothing of the kernel), finite there itself."""
    rows = torch.isfinite(reference).all(dim=-1)
    out, reference = out[rows], reference[rows]
    if not rows.any() or not torch.isfinite(out).all():  # no row to judge by: no kernel is chosen on it
        return False
    return bool((out - reference).norm() <= AGREE * reference.norm().clamp(min=1e-12))


def choices() -> list:
    """What each (mode, in, out, rows, threads) met runs: its times ("ms"), or the file it was read from."""
    return kernel_store.report(CHOICES, TIMINGS, ("mode", "in", "out", "rows", "threads"), "kernel")


def int8_linears(model: nn.Module) -> list:
    """(name, module) of every Int8Linear in `model`."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Int8Linear)]


def swap_linears(model: nn.Module, mode: str, skip=(), quantise: bool = True, smooth=None) -> list:
    """Replace every nn.Linear of `model` (but the names in `skip`) by an Int8Linear of `mode`,
    quantising its weight (quantise=False: empty, to load into); smooth: {name: (in,) factors, or True
    to load into}; returns the names swapped."""
    smooth, swapped = smooth or {}, []
    bad = quantise and next((n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in skip
                             and not bool(torch.isfinite(m.weight).all())), None)
    if bad:  # before any swap: the model is left whole
        raise ValueError(f"{bad}.weight holds non-finite values (NaN or inf), which int8 cannot hold")
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and full not in skip:
                setattr(module, child_name, Int8Linear.from_linear(child, mode, quantise, smooth.get(full)))
                swapped.append(full)
    return swapped


TRAINING = "training it is refused; train the fp32 model, then lmforge quantize it"  # refuse_int8's default


def refuse_int8(module: nn.Module, why: str = TRAINING, what: str = "the model") -> None:
    """A ValueError naming the way out if `module` holds int8 Linears, which have no gradients to
    train and no fp32 weights to rank, slice or copy: "{what} is int8-quantised (...): {why}"."""
    found = int8_linears(module)
    if found:
        raise ValueError(f"{what} is int8-quantised ({len(found)} Int8Linear layers, e.g. {found[0][0]}): "
                         f"{why}")
