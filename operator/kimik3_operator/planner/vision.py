"""How a role's engines run K3's vision encoder: off, whole on its one GPU, or whole on every
tensor-parallel rank with the images split among them.

vLLM 0.33.0 (docs/multimodal.md, "The vision encoder"):
- With images turned off (`--limit-mm-per-prompt {"image": 0}`) the tower is built on the meta
  device and never loaded (`_mark_tower_model`, models/kimi_k3/nvidia/model.py:1617).
- `--mm-encoder-tp-mode weights` (vLLM's default) shards the tower's 12 heads over tensor
  parallel, an all-reduce in each of its 27 blocks; `data` keeps the whole 0.8 GB tower on each
  rank, hands each rank whole images (balanced by patch count) and gathers the embeddings once
  (vision.py:392-560). K3 declares `data` (supports_encoder_tp_data, model.py:1581).
- When 12 is not a multiple of the tensor size (8, 16, 24, ...) vLLM takes `data` whatever the
  flag says (vision.py:141-156).

The operator runs `data` on every tensor-parallel role, as vLLM's recipe for a large vision MoE
does (Qwen3-VL: `--tensor-parallel-size 8 --mm-encoder-tp-mode data`): the tower is small beside
the language model, so its per-block all-reduces cost more than the copy. It renders the flag only
where vLLM would not choose `data` itself (tensor 2, 3, 4, 6, 12), so the command lines at TP 8 or
16 do not change.
"""

from __future__ import annotations

from typing import Literal

from ..kimi_k3 import VISION_HEADS

VisionEncoder = Literal["off", "weights", "data"]
"""`kimik3 plan` and status spell it as vLLM's --mm-encoder-tp-mode does; `off`: images turned off."""


def vision_encoder(tensor: int, images_per_prompt: int | None) -> VisionEncoder:
    """The mode the role's engines run the tower in (`weights` on a single rank: all of it there)."""
    if images_per_prompt == 0:
        return "off"
    return "data" if tensor > 1 else "weights"


def encoder_args(mode: VisionEncoder, tensor: int) -> list[str]:
    """`--mm-encoder-tp-mode data` where vLLM would otherwise shard the tower by heads."""
    if mode == "data" and VISION_HEADS % tensor == 0:
        return ["--mm-encoder-tp-mode", "data"]
    return []
