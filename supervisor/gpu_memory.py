"""Which GPU holds what of a model, estimated before it loads: the rule llama.cpp places
layers by (src/llama-model.cpp, load_tensors), applied to the GGUF's own tensor table.
Pure: tensor sizes and options in, bytes per device out (issue 43, item 2).

- The last `n_gpu_layers` of the n_layer + 1 layers (the output layer is the last) go to
  the GPUs, spread in `tensor_split`'s proportions (evenly when none is given: llama.cpp
  splits by free memory, which only the worker can read), all on `main_gpu` with
  split_mode "none". The token embeddings always stay in host memory; a model whose output
  shares them gets a copy on the output layer's device.
- A tensor an override names stays where the override puts it: cpu_moe's experts and an
  `override_tensor` to CPU in host memory, one to a GPU's buffer type on that GPU.
- Each layer's KV cache sits on its layer's device, unless kv_offload is off.
- Each GPU in use holds compute buffers besides: COMPUTE_BYTES, an allowance (llama-server's
  --fit leaves 1 GiB a device); once the worker has loaded, the figures llama.cpp logged
  replace the whole estimate (worker/load_log.py, Ready.device_bytes).

The devices are named as the config names them: `devices` when the model sets it, else the
names of the `gpu_memory_budget` table (the machine's GPUs, as the operator lists them),
else one pool, "GPU".
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from worker.protocol.load_options import LoadOptions, tensor_overrides

COMPUTE_BYTES = 512 * 1024 * 1024
POOL = "GPU"
_LAYER = re.compile(r"^blk\.(\d+)\.")


def layer_devices(n_layer: int, n_gpu_layers: int, o: LoadOptions, gpus: Sequence[str]) -> list[str | None]:
    """Each of the n_layer + 1 layers' device (None: host memory), the output layer last."""
    total = n_layer + 1
    wanted = total if n_gpu_layers < 0 else min(n_gpu_layers, total)
    if not gpus or wanted == 0:
        return [None] * total
    if o.split_mode == "none":
        gpus = [gpus[min(o.main_gpu, len(gpus) - 1)]]
    weights = [float(x) for x in o.tensor_split[: len(gpus)]] if o.split_mode != "none" else []
    weights += [0.0] * (len(gpus) - len(weights))
    if not any(weights):
        weights = [1.0] * len(gpus)
    cumulative, run = [], 0.0
    for w in weights:
        run += w
        cumulative.append(run / sum(weights))
    start = total - wanted
    out: list[str | None] = [None] * start
    for il in range(start, total):
        at = bisect.bisect_right(cumulative, (il - start) / wanted)
        out.append(gpus[min(at, len(gpus) - 1)])
    return out


@dataclass(frozen=True)
class Placement:
    gpu: dict[str, int]  # bytes each GPU holds: weights, KV cache, compute allowance
    moved: int  # bytes of weights and KV cache that go to a GPU instead of host memory


def gpu_bytes(
    tensors: Mapping[str, int], n_layer: int, kv_per_layer: Sequence[int], n_gpu_layers: int,
    o: LoadOptions, gpus: Sequence[str],
) -> dict[str, int]:
    """Bytes each GPU will hold for this model: its layers' weights, their KV cache and a
    compute allowance. Empty when nothing is offloaded."""
    return place(tensors, n_layer, kv_per_layer, n_gpu_layers, o, gpus).gpu


def place(
    tensors: Mapping[str, int], n_layer: int, kv_per_layer: Sequence[int], n_gpu_layers: int,
    o: LoadOptions, gpus: Sequence[str],
) -> Placement:
    """gpu_bytes, and how much of it leaves host memory (not the copy of tied embeddings,
    nor the compute buffers)."""
    if o.devices == ["none"]:
        return Placement({}, 0)
    gpus = list(o.devices) if o.devices else list(gpus) or [POOL]
    where = layer_devices(n_layer, n_gpu_layers, o, gpus)
    overrides = [(re.compile(p), b) for p, b in tensor_overrides(o)]
    out: dict[str, int] = {}
    moved = 0
    for name, size in tensors.items():
        dev = _tensor_device(name, where, n_layer)
        for pattern, buffer in overrides:
            if pattern.search(name):
                dev = None if buffer == "CPU" else buffer
                break
        if dev is not None:
            out[dev] = out.get(dev, 0) + size
            moved += size
    if "output.weight" not in tensors and (dev := where[n_layer]) is not None:
        # Tied embeddings (gemma, many small models): llama.cpp copies token_embd to the
        # output layer's device as its output matrix (TENSOR_DUPLICATED).
        out[dev] = out.get(dev, 0) + tensors.get("token_embd.weight", 0)
    if o.kv_offload:
        for il, kv in enumerate(kv_per_layer[:n_layer]):
            if (dev := where[il]) is not None:
                out[dev] = out.get(dev, 0) + kv
                moved += kv
    for dev in out:
        out[dev] += COMPUTE_BYTES
    return Placement(out, moved)


def _tensor_device(name: str, where: Sequence[str | None], n_layer: int) -> str | None:
    if (m := _LAYER.match(name)) is not None:
        il = int(m[1])
        return where[il] if il < n_layer else None
    if name.startswith("token_embd"):
        return None  # the input layer is always the CPU's (llama-model.cpp, dev_input)
    return where[n_layer]  # output, output_norm and the rest: the output layer's


def fits_gpus(used: Mapping[str, int], adding: Mapping[str, int], budget: Mapping[str, int]) -> bool:
    """Whether `adding` fits next to `used` under `budget`: per device named in it, or in
    all together under its one pool ("GPU", a single gpu_memory_budget size)."""
    if not budget:
        return True
    if set(budget) == {POOL}:
        return sum(used.values()) + sum(adding.values()) <= budget[POOL]
    return all(used.get(d, 0) + adding.get(d, 0) <= cap for d, cap in budget.items())
