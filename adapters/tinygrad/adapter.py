"""The `tinygrad` backend: `Tensor.scaled_dot_product_attention` on tinygrad's CPU device.

What tinygrad 0.14 computes (tinygrad/mixin/rand.py, `scaled_dot_product_attention`):

    qk = q.matmul(k^T, dtype=least_upper_dtype(q, k, float32)) / sqrt(D)
    is_causal: attn_mask = ones(Lq, Lk).tril()     (top-left; raises if attn_mask is given too)
    bool attn_mask: True = attend, turned into where(0, -inf); float attn_mask: added
    return qk.cast(q.dtype).softmax(-1).dropout(dropout_p) @ v

- No `scale` argument: a custom scale s is applied by multiplying Q by c = s * sqrt(Dk) before the
  call (ATTN-OP-4), formed in float64 and rounded to the dtype under test; for gradients
  dQ = c * dQ', rounded to the dtype like the gradient of a user's own `q * c`. That extra rounding
  of Q is the adapter's, and measured it does not stay inside the tolerance model: 16.1x the
  float16 baseline on a ci case (B=1 Lq=47 Lk=63 Dk=8, scale 1, logits ~1.6e3; the same logits
  without the adapter's rounding: 0.95x), and up to 3.6x in float32 ('large' regime, Dk=8, 32
  cases; exact pre-scaling on the same data: at most 0.66x). So a custom scale is declared only
  where Q * c is exact in the dtype (c a power of two times Q's values without rounding, e.g.
  Dk = 16 and s = 0.125), and always in float64, whose analytic bound (ATTN-TOL-4) is a worst case
  with a factor gamma = 2 that covers one more rounding of Q per logit ((Dk + 3) A_i <= 2 (Dk + 2) A_i).
  Other custom-scale cases are unsupported, with that reason.
- Bottom-right causal, padding lengths and a mask combined with causal are folded into one boolean
  `attn_mask` (`adapters/sdpa_convention.py`); a bias is passed as a float `attn_mask` in the
  case's dtype, plus `where(visible, 0, -inf)` when other masking is combined with it (built in
  tinygrad, so the bias keeps its own shape and autograd returns dBias in that shape).
- Grouped heads use `enable_gqa=True` (repeat_interleave: consecutive query heads share a KV head).
- Dropout applies only in training mode (docstring of `Tensor.dropout`: "NOTE: dropout is only
  applied when `TRAINING` is set"); the adapter runs a case with dropout_p > 0 inside
  `Context(TRAINING=1)` after `Tensor.manual_seed(case.seed)`. Outside training mode
  `dropout_p` is ignored: documented, so not a divergence (see adapters/tinygrad/divergences.toml).
- Gradients: tinygrad's autograd (`Tensor.gradient`), realized together with the output.

The CPU device needs `clang` on PATH: tinygrad compiles every kernel with it (and the device's own
worker programs at start-up, whatever renderer is chosen). Without it the backend says so in one
line. bfloat16 kernels are rendered with the `__bf16` C type, which clang before 15 rejects
("__bf16 is not supported on this target", Debian 12's clang 14; upstream tinygrad#6909): the
adapter compiles one small bfloat16 kernel at start-up and, if that fails, bfloat16 is
unsupported with the compiler's message as the reason.

tinygrad compiles each new shape (kernels are cached in memory per process and on disk in
tinygrad's CACHEDB, ~/.cache/tinygrad/cache.db). BEAM search stays off (its default).
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
from typing import Any, Callable, Literal

import numpy as np

from attnconf.reference import Case, numpy_dtype, round_to, visibility
from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import Adapter, KernelError, Result
from attnconf.adapters.callable import CallableAdapter
from attnconf.adapters.sdpa_convention import fold_mask

FRAMEWORK = "tinygrad"
INSTALL_HINT = "pip install tinygrad, and a C compiler for its CPU device: apt-get install clang"
DEVICES = ("cpu",)
TG_DEVICE = "CPU"
CAPS = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths", "gqa",
                  "custom_scale", "dv_ne_dk", "cross", "mask_with_causal", "dropout", "grads", "dbias",
                  "noncontiguous", "broadcast_kv"})


class TinygradUnavailable(Exception):
    """tinygrad is installed but its CPU device cannot run here (one-line message)."""


def compiler() -> str:
    """The C compiler tinygrad's CPU device calls (it honours $CC)."""
    return os.environ.get("CC", "clang")


def compiler_version() -> str:
    try:
        out = subprocess.run([compiler(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "not found"
    return out.splitlines()[0].strip() if out else "unknown"


class _StderrCapture:
    """Capture file descriptor 2 (clang writes its diagnostics there, not into the exception)."""

    def __enter__(self):
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")
        self._file.close()
        return False


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if "error:" in line:
            return line.split("error:", 1)[1].strip()
    return text.strip().splitlines()[0] if text.strip() else ""


_STATE: dict[str, Any] = {}


def device_state() -> dict[str, Any]:
    """Open tinygrad's CPU device once and probe which dtypes compile; cached for the process.

    Returns {"dtypes": tuple, "unsupported": {dtype: reason}}; raises TinygradUnavailable with a
    one-line reason when the device cannot start (no clang)."""
    if _STATE:
        return _STATE
    if shutil.which(compiler()) is None:
        raise TinygradUnavailable(f"tinygrad's CPU device compiles its kernels with {compiler()!r}, which is not "
                                  f"on PATH; install it with: apt-get install clang")
    from tinygrad import Device, Tensor  # noqa: PLC0415

    with _StderrCapture() as cap:
        try:
            Device[TG_DEVICE]
            (Tensor([1.0, 2.0], device=TG_DEVICE) * 2).realize()
        except Exception as exc:
            err = exc
        else:
            err = None
    if err is not None:
        raise TinygradUnavailable(f"tinygrad's {TG_DEVICE} device does not start: {type(err).__name__}: "
                                  f"{_first_error(cap.text) or str(err).splitlines()[0]}")
    unsupported: dict[str, str] = {}
    with _StderrCapture() as cap:
        try:
            # a kernel that loads and stores a bfloat16 buffer (a fused cast alone never names the type)
            to_numpy((to_tensor(np.array([1.5, -2.25]), "bfloat16") * 2).realize())
        except Exception as exc:
            err = exc
        else:
            err = None
    if err is not None:
        why = _first_error(cap.text) or f"{type(err).__name__}: {str(err).splitlines()[0]}"
        unsupported["bfloat16"] = (f"tinygrad's clang renderer emits the __bf16 C type, which {compiler_version()} "
                                   f"rejects ({why}; tinygrad#6909)")
    _STATE.update(dtypes=tuple(d for d in DTYPES if d not in unsupported), unsupported=unsupported)
    return _STATE


def _compile_options() -> dict[str, int]:
    """Compile kernels in this process (PARALLEL=0) unless the user set PARALLEL.

    tinygrad's default compiles through a pool of spawned worker processes (PARALLEL = CPU count),
    each re-importing tinygrad and recycled every 16 kernels. A suite run compiles a few kernels per
    call, so the pool costs more than it saves: measured (test_output_matches_reference, ci profile,
    warm disk cache, this 2-core machine under load) 29.1 s of CPU with the pool, 24.9 s without.
    PARALLEL only decides where the same kernels are compiled; it changes no generated code."""
    return {} if "PARALLEL" in os.environ else {"PARALLEL": 0}


# ---- conversions ------------------------------------------------------------
def _tg_dtype(dtype: str):
    from tinygrad import dtypes  # noqa: PLC0415

    return {"float64": dtypes.float64, "float32": dtypes.float32, "float16": dtypes.float16,
            "bfloat16": dtypes.bfloat16, "bool": dtypes.bool}[dtype]


def to_tensor(x: np.ndarray, dtype: str):
    """An exact tinygrad copy of `x` as `dtype` ('bool' for masks) on the CPU device.

    float64/32/16 and bool come straight from a NumPy array of that dtype; bfloat16 from the bit
    pattern (uint16) bitcast, so no conversion kernel runs."""
    from tinygrad import Tensor, dtypes  # noqa: PLC0415

    x = np.asarray(x)
    if dtype == "bool":
        return Tensor(np.ascontiguousarray(x, dtype=bool), device=TG_DEVICE)
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(x.astype(numpy_dtype("bfloat16"))).view(np.uint16)
        return Tensor(bits, device=TG_DEVICE).bitcast(dtypes.bfloat16)
    return Tensor(np.ascontiguousarray(x, dtype=numpy_dtype(dtype)), device=TG_DEVICE)


def dtype_name(t: Any) -> str:
    from tinygrad import dtypes  # noqa: PLC0415

    names = {dtypes.float64: "float64", dtypes.float32: "float32", dtypes.float16: "float16",
             dtypes.bfloat16: "bfloat16", dtypes.bool: "bool"}
    return names.get(t.dtype, str(t.dtype))


def to_numpy(t: Any) -> np.ndarray:
    """float64 NumPy copy of a realized tinygrad tensor (raises TypeError for anything else)."""
    from tinygrad import Tensor, dtypes  # noqa: PLC0415

    if not isinstance(t, Tensor):
        raise TypeError(f"not a tinygrad Tensor: {type(t).__name__}")
    if t.dtype == dtypes.bfloat16:
        bits = t.bitcast(dtypes.uint16).numpy()
        return bits.view(numpy_dtype("bfloat16")).astype(np.float64)
    a = t.numpy()
    return a if a.dtype == bool else a.astype(np.float64)


def _layout(x: np.ndarray, dtype: str, layout: str, kv: bool):
    """The tensor handed to tinygrad in the case's layout (same values; only the view differs)."""
    if layout == "broadcast_kv" and kv:          # a batch-1 buffer expanded over the batch
        return to_tensor(x[:1], dtype).expand(*x.shape)
    if layout == "noncontiguous":                 # the (B, L, H, D) projection layout seen as (B, H, L, D)
        return to_tensor(np.transpose(x, (0, 2, 1, 3)), dtype).permute(0, 2, 1, 3)
    return to_tensor(x, dtype)


def _equal_over_batch(case: Case) -> bool:
    return all(np.array_equal(x, np.broadcast_to(x[:1], x.shape), equal_nan=True) for x in (case.k, case.v))


def _error_line(exc: BaseException, captured: str = "") -> str:
    first = _first_error(captured)
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first or (msg[0] if msg else '')}"


# ---- the adapter ------------------------------------------------------------
class SdpaAdapter(Adapter):
    """`Tensor.scaled_dot_product_attention` on tinygrad's CPU device (clang renderer)."""

    backend = "tinygrad"
    name = "tinygrad:sdpa"
    devices = ("cpu",)
    capabilities = CAPS
    max_head_dim = None
    renderer = "CLANG"
    # example_budget = 0.3 (8 of the ci profile's 25 examples per unit of test weight). tinygrad compiles
    # every new shape, and its Python code generation (to_program: graph rewriting, then clang) is most of
    # a run. The run is at the coverage floor (spec/coverage.toml): measured 2026-11-25 on a 2-core Intel
    # Xeon, ci profile, warm clang disk cache, budget 0.3 drew 516 examples (1294 kernels compiled, 103 s
    # of the 151 s in pytest inside to_program) and budget 0.01 drew 501 in the same time (157 s in one
    # process; 110 s with -n 2 against 115 s), so a smaller budget buys nothing. Per dtype in one process:
    # float64 46 s, float32 49 s, float16 44 s, tests without a dtype 10 s; -n 2 schedules whole dtypes
    # (conformance/engine/plugin.py), so its best split is about 90 s of test time plus start-up.
    # Cut before reducing examples: kernels compile in-process (PARALLEL=0, see _compile_options:
    # 15 % less CPU), BEAM search stays off, tinygrad's disk cache (CACHELEVEL 2) is kept.
    example_budget = 0.3

    def __init__(self, device: str = "cpu"):
        super().__init__(device)
        state = device_state()
        self.dtypes = state["dtypes"]
        self._unsupported_dtypes = state["unsupported"]

    def supports(self, case: Case, *, need: frozenset[str] = frozenset()) -> Literal[True] | str:
        if case.dtype in self._unsupported_dtypes:
            return f"{self.name} does not run {case.dtype}: {self._unsupported_dtypes[case.dtype]}"
        return super().supports(case, need=need)

    def extra_support(self, case: Case) -> Literal[True] | str:
        if case.layout == "broadcast_kv" and not _equal_over_batch(case):
            return "layout broadcast_kv needs K and V equal across the batch"
        c = self.q_factor(case)
        if c is not None and case.dtype != "float64":
            with np.errstate(over="ignore", invalid="ignore"):
                exact = np.array_equal(round_to(case.q * c, case.dtype), case.q * c)
            if not exact:
                return (f"tinygrad has no scale argument and Q * scale * sqrt(Dk) = Q * {c:.6g} is not exact in "
                        f"{case.dtype}: that rounding is the adapter's, and measured up to 16x the baseline error")
        return True

    @staticmethod
    def q_factor(case: Case) -> float | None:
        """c = scale * sqrt(Dk): tinygrad divides the logits by sqrt(Dk), so Q * c gives `scale`."""
        return None if case.scale is None else float(case.scale) * math.sqrt(case.shape["Dk"])

    # -- building the call ------------------------------------------------------
    def inputs(self, case: Case) -> dict[str, Any]:
        """The tinygrad tensors of one call: q (pre-scaled if needed), k, v, attn_mask, bias leaf, flags."""
        from tinygrad import Tensor  # noqa: PLC0415

        t = case.dtype
        c = self.q_factor(case)
        q = case.q if c is None else round_to(case.q * c, t)
        tensors = {"q": _layout(q, t, case.layout, kv=False), "k": _layout(case.k, t, case.layout, kv=True),
                   "v": _layout(case.v, t, case.layout, kv=True), "bias": None, "attn_mask": None,
                   "is_causal": False}
        if case.bias is None:
            mask, is_causal = fold_mask(case)
            tensors["is_causal"] = is_causal
            if mask is not None:
                tensors["attn_mask"] = to_tensor(mask, "bool")
            return tensors
        bias = to_tensor(case.bias, t)
        tensors["bias"] = bias
        if case.mask is None and case.causal is None and case.q_lengths is None and case.kv_lengths is None:
            tensors["attn_mask"] = bias
            return tensors
        s = case.shape
        vis = visibility((s["B"], s["Hq"], s["Lq"], s["Lk"]), mask=case.mask, causal=case.causal,
                         q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)
        if vis.shape[1] > 1 and (vis == vis[:, :1]).all():
            vis = vis[:, :1]
        hidden = to_tensor(vis, "bool").where(Tensor(0.0, device=TG_DEVICE, dtype=bias.dtype), float("-inf"))
        tensors["attn_mask"] = bias + hidden
        return tensors

    def call(self, tensors: dict[str, Any], case: Case):
        s = case.shape
        return tensors["q"].scaled_dot_product_attention(
            tensors["k"], tensors["v"], attn_mask=tensors["attn_mask"], dropout_p=case.dropout_p,
            is_causal=tensors["is_causal"], enable_gqa=s["Hkv"] != s["Hq"])

    def run(self, case: Case, *, grads: bool = False) -> Result:
        from tinygrad import Tensor  # noqa: PLC0415
        from tinygrad.helpers import Context  # noqa: PLC0415

        if grads and case.grad_out is None:
            raise ValueError("grads=True needs case.grad_out")
        with _StderrCapture() as cap:
            try:
                with Context(DEV=f"{TG_DEVICE}:{self.renderer}", TRAINING=1 if case.dropout_p else 0, **_compile_options()):
                    if case.dropout_p:
                        Tensor.manual_seed(case.seed)
                    tensors = self.inputs(case)
                    out = self.call(tensors, case)
                    targets, names = [tensors["q"], tensors["k"], tensors["v"]], ["dq", "dk", "dv"]
                    if grads and tensors["bias"] is not None:
                        targets.append(tensors["bias"])
                        names.append("dbias")
                    gs = out.gradient(*targets, gradient=to_tensor(case.grad_out, case.dtype)) if grads else []
                    Tensor.realize(out, *gs)
                    result = Result(out=to_numpy(out), out_dtype=dtype_name(out), kernel=self.kernel_name())
                    if grads:
                        result.grads = {n: to_numpy(g) for n, g in zip(names, gs)}
            except Exception as exc:
                err = exc
            else:
                err = None
        if err is not None:
            raise KernelError(f"{self.name} raised {_error_line(err, cap.text)}") from err
        if grads:
            c = self.q_factor(case)
            if c is not None:   # chain rule through the adapter's Q * c, rounded as a user's q * c would be
                result.grads["dq"] = round_to(result.grads["dq"] * c, case.dtype)
        return result

    def run_raw(self, q, k, v, dtype):
        from tinygrad.helpers import Context  # noqa: PLC0415

        with Context(DEV=f"{TG_DEVICE}:{self.renderer}"):
            ts = [to_tensor(x, dtype) for x in (q, k, v)]
            gqa = q.ndim == 4 and k.ndim == 4 and q.shape[1] != k.shape[1]
            return to_numpy(ts[0].scaled_dot_product_attention(ts[1], ts[2], enable_gqa=gqa).realize())

    def kernel_name(self) -> str:
        return f"tinygrad Tensor.scaled_dot_product_attention (device {TG_DEVICE}, renderer {self.renderer})"

    def describe(self) -> dict[str, Any]:
        import tinygrad  # noqa: PLC0415
        from tinygrad.helpers import CACHEDB, CACHELEVEL, getenv  # noqa: PLC0415

        return {**super().describe(), "framework": "tinygrad", "version": _version(tinygrad),
                "kernel": self.kernel_name(), "tinygrad_device": TG_DEVICE, "renderer": self.renderer,
                "compiler": compiler_version(), "CC": compiler(), "BEAM": getenv("BEAM", 0),
                "CACHELEVEL": CACHELEVEL.value, "CACHEDB": CACHEDB,
                "unsupported_dtypes": dict(self._unsupported_dtypes),
                "scale": "no scale argument: Q multiplied by scale * sqrt(Dk) (float64, rounded once to the dtype)"}


def _version(module) -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("tinygrad")
    except Exception:
        return getattr(module, "__version__", "unknown")


IMPLEMENTATIONS: tuple[type[Adapter], ...] = (SdpaAdapter,)


def implementations(device: str, options: dict[str, Any]) -> list[Adapter]:
    try:
        return [cls(device) for cls in IMPLEMENTATIONS if device in cls.devices]
    except TinygradUnavailable as exc:
        from attnconf.adapters import UsageError  # noqa: PLC0415 (the package is initialised by then)

        raise UsageError(f"backend 'tinygrad' cannot run here: {exc}") from None


class TinygradKernelAdapter(CallableAdapter):
    """A third-party tinygrad kernel with the SDPA convention ((B, H, L, D) tinygrad tensors)."""

    def run(self, case: Case, *, grads: bool = False) -> Result:
        from tinygrad.helpers import Context  # noqa: PLC0415

        with Context(TRAINING=1 if case.dropout_p else 0):
            return super().run(case, grads=grads)


def kernel_adapter(fn: Callable[..., Any], device: str, name: str) -> Adapter:
    try:
        state = device_state()
    except TinygradUnavailable as exc:
        from attnconf.adapters import UsageError  # noqa: PLC0415

        raise UsageError(f"backend 'tinygrad' cannot run here: {exc}") from None

    def numpy_out(t: Any) -> np.ndarray:
        if hasattr(t, "realize"):
            t = t.realize()
        return to_numpy(t)

    return TinygradKernelAdapter(fn, backend="tinygrad", name=name, device=device, to_array=to_tensor,
                                 to_numpy=numpy_out, dtype_name=dtype_name, dtypes=state["dtypes"])
