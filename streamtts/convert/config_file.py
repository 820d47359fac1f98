"""What ``streamtts download`` and ``streamtts convert-hf`` both write: the backbone's file name
in the published layout, and the run keys of the config file next to the weights."""

from __future__ import annotations


def gguf_file_name(quant: str) -> str:
    """The backbone GGUF of one quant, named as MOSS-TTS-GGUF publishes it."""
    return f"MOSS_TTS_{quant}.gguf"


_RUN_KEYS = """\
use_gpu_audio: {gpu}
heads_backend: auto{heads_note}
{fused_line}n_gpu_layers: {ngl}
n_ctx: {n_ctx}
n_batch: 512
flash_attn: auto
max_new_tokens: {max_new_tokens}
max_streams: {streams}
"""


def config_yaml(
    head: str,
    *,
    gpu: bool,
    fused_gguf: str | None,
    heads_note: str = "",
    n_ctx: int = 4096,
    max_new_tokens: int = 3072,
) -> str:
    """``head`` (the comment lines and the path keys) followed by the run keys: on a GPU every
    layer offloaded and 16 streams, else the CPU and one stream; ``fused_gguf`` the fused
    heads file when one was written (a path relative to the config's folder); ``n_ctx`` and
    ``max_new_tokens`` the model's (convert/member.py)."""
    return head + _RUN_KEYS.format(
        n_ctx=n_ctx,
        max_new_tokens=max_new_tokens,
        gpu="true" if gpu else "false",
        heads_note=heads_note,
        fused_line=f"fused_gguf: {fused_gguf}\n" if fused_gguf is not None else "",
        ngl=-1 if gpu else 0,
        streams=16 if gpu else 1,
    )
