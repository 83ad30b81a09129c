"""A model's load options (worker/protocol/load_options.py) set into llama.cpp's
llama_model_params and llama_context_params, as llama-server's common.cpp does
(common_model_params_to_llama, common_context_params_to_llama).

Two of them are arrays of pointers llama-cpp-python declares as bare `void *`: the devices
(`devices`) and the tensor overrides (`override_tensor`, `cpu_moe`). They are built here
with ggml's own functions, looked up through libllama's handle: the package's lib/ folder
holds separate copies of libggml whose CPU buffer type is another pointer than the one
libllama compares against (llama-model-loader.cpp), so an override to "CPU" made with a copy
would be silently treated as some other device's.

Every array built here must outlive the load: `Params.keep` holds them.
"""

from __future__ import annotations

import ctypes
import resource
from dataclasses import dataclass, field
from typing import Any

import llama_cpp

from worker.protocol.load_options import (
    KV_TYPES,
    BadOption,
    LoadOptions,
    kv_override,
    load_mode,
    tensor_overrides,
)

_FLASH = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO, "off": 0, "on": 1}
_SPLIT = {"none": 0, "layer": 1, "row": 2, "tensor": 3}  # enum llama_split_mode
_ROPE = {None: -1, "none": 0, "linear": 1, "yarn": 2}  # enum llama_rope_scaling_type


class OptionError(Exception):
    """An option this llama.cpp cannot apply (a device it does not have); the message
    names the option."""


class _BuftOverride(ctypes.Structure):  # struct llama_model_tensor_buft_override (llama.h)
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _fn(name: str, restype: Any, argtypes: list[Any]) -> Any:
    f = getattr(llama_cpp.llama_cpp._lib, name)
    f.restype, f.argtypes = restype, argtypes
    return f


_dev_count = _fn("ggml_backend_dev_count", ctypes.c_size_t, [])
_dev_get = _fn("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t])
_dev_name = _fn("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p])
_dev_type = _fn("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p])
_dev_buft = _fn("ggml_backend_dev_buffer_type", ctypes.c_void_p, [ctypes.c_void_p])
_buft_name = _fn("ggml_backend_buft_name", ctypes.c_char_p, [ctypes.c_void_p])
_DEV_CPU = 0  # enum ggml_backend_dev_type


def devices() -> list[tuple[str, int, int]]:
    """This llama.cpp's devices: (name, ggml_backend_dev_type, its default buffer type)."""
    out = []
    for i in range(int(_dev_count())):
        dev = _dev_get(i)
        out.append(((_dev_name(dev) or b"").decode(), int(_dev_type(dev)), int(_dev_buft(dev))))
    return out


def buffer_types() -> dict[str, int]:
    """The buffer types -ot may name: each device's own (CPU, CUDA0, Vulkan1), as
    llama-server lists them (common/arg.cpp, parse_tensor_buffer_overrides)."""
    return {(_buft_name(buft) or b"").decode(): buft for _, _, buft in devices()}


@dataclass
class Params:
    model: Any  # llama_model_params
    keep: list[Any] = field(default_factory=list)  # arrays llama.cpp reads during the load
    overrides: list[tuple[str, str]] = field(default_factory=list)


def model_params(o: LoadOptions, n_gpu_layers: int, repack: bool) -> Params:
    """llama_model_params for `o`. Raises OptionError for a device or buffer type this
    build does not have (the config check cannot know: it depends on the machine)."""
    p = Params(llama_cpp.llama_model_default_params())
    m = p.model
    m.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 0x7FFFFFFF
    m.use_extra_bufts = repack
    m.load_mode = load_mode(o)
    m.split_mode = _SPLIT[o.split_mode]
    m.main_gpu = o.main_gpu
    m.check_tensors = o.check_tensors
    if o.tensor_split:
        split = (ctypes.c_float * 128)(*o.tensor_split)  # llama.cpp reads llama_max_devices() of them
        p.keep.append(split)
        m.tensor_split = split
    if o.devices:
        m.devices = _device_array(o.devices, p.keep)
    try:
        p.overrides = tensor_overrides(o)
        kv = [kv_override(e) for e in o.override_kv]
    except BadOption as exc:  # the config check says so first; a spec made by hand may not
        raise OptionError(str(exc)) from None
    if p.overrides:
        m.tensor_buft_overrides = _override_array(p.overrides, p.keep)
    if kv:
        m.kv_overrides = _kv_array(kv, p.keep)
    return p


def _device_array(names: list[str], keep: list[Any]) -> int:
    """A NULL-terminated array of ggml_backend_dev_t; ["none"] is the lone NULL (no GPU)."""
    found = {name.lower(): (kind, i) for i, (name, kind, _) in enumerate(devices())}
    chosen: list[int | None] = []
    if names != ["none"]:
        for name in names:
            kind, index = found.get(name.lower(), (None, -1))
            if kind is None or kind == _DEV_CPU:
                gpus = [n for n, k, _ in devices() if k != _DEV_CPU]
                raise OptionError(
                    f"devices: this llama.cpp has no GPU device named {name!r} "
                    f"(it has: {', '.join(gpus) or 'none, a CPU-only build'})"
                )
            chosen.append(int(_dev_get(index)))
    arr = (ctypes.c_void_p * (len(chosen) + 1))(*chosen, None)
    keep.append(arr)
    return ctypes.cast(arr, ctypes.c_void_p).value or 0


def _override_array(overrides: list[tuple[str, str]], keep: list[Any]) -> int:
    types = buffer_types()
    arr = (_BuftOverride * (len(overrides) + 1))()  # zeroed: the last is the {NULL, NULL} end
    for i, (pattern, name) in enumerate(overrides):
        if name not in types:
            raise OptionError(
                f"override_tensor: no buffer type named {name!r} in this llama.cpp (it has: {', '.join(types)})"
            )
        raw = pattern.encode()
        keep.append(raw)
        arr[i].pattern = raw
        arr[i].buft = types[name]
    keep.append(arr)
    return ctypes.cast(arr, ctypes.c_void_p).value or 0


def _kv_array(items: list[tuple[str, int, int | float | bool | str]], keep: list[Any]) -> Any:
    arr = (llama_cpp.llama_model_kv_override * (len(items) + 1))()  # the last's empty key ends it
    for i, (key, tag, value) in enumerate(items):
        arr[i].key = key.encode()
        arr[i].tag = tag
        union: Any = arr[i].value  # llama_model_kv_override_value; the binding types it as a value
        if isinstance(value, bool):
            union.val_bool = value
        elif isinstance(value, int):
            union.val_i64 = value
        elif isinstance(value, float):
            union.val_f64 = value
        else:
            union.val_str = value.encode()
    keep.append(arr)
    return ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_kv_override))


def context_options(c: Any, o: LoadOptions) -> None:
    """Set `o`'s context options into llama_context_params `c`: every context whose cells
    are copied into the model's (worker/media/beside.py) must take the same, or the copy
    is refused (a state holds its types and its RoPE'd keys)."""
    c.flash_attn_type = _FLASH[o.flash_attn]
    c.type_k = KV_TYPES[o.cache_type_k][0]
    c.type_v = KV_TYPES[o.cache_type_v][0]
    c.offload_kqv = o.kv_offload
    c.op_offload = o.op_offload
    c.rope_scaling_type = _ROPE[o.rope_scaling]
    c.rope_freq_base = o.rope_freq_base
    c.rope_freq_scale = o.rope_freq_scale
    c.yarn_orig_ctx = o.yarn_orig_ctx
    c.yarn_ext_factor = o.yarn_ext_factor
    c.yarn_attn_factor = o.yarn_attn_factor
    c.yarn_beta_slow = o.yarn_beta_slow
    c.yarn_beta_fast = o.yarn_beta_fast


def _may_lock_any() -> bool:
    """Whether this process holds CAP_IPC_LOCK, which lifts RLIMIT_MEMLOCK."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 14))
    except OSError:
        pass
    return False


def mlock_warning(o: LoadOptions, model_bytes: int) -> str | None:
    """Why `mlock` will not pin the model, said before the load (llama.cpp only warns,
    buffer by buffer, and loads unpinned): RLIMIT_MEMLOCK below the model's size."""
    if not o.mlock or _may_lock_any():
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= model_bytes:
        return None
    return (
        f"mlock = true, but this process may lock {soft / 2**20:.0f} MiB (RLIMIT_MEMLOCK) and the model "
        f"takes {model_bytes / 2**20:.0f} MiB: it loads unpinned (raise LimitMEMLOCK= in the systemd unit, "
        "or `ulimit -l`)"
    )
