"""The model's fixed audio units (contract sections 2 and 7), defined once.

A model's ``config.json`` may carry other token ids (``core.tokens.TokenIds``), but the
codec's frame is the same for every published MOSS-TTS-Delay model.
"""

from __future__ import annotations

SAMPLE_RATE = 24000  # Hz: the codec's waveform
FRAME_SAMPLES = 1920  # samples per audio frame
FRAME_RATE = SAMPLE_RATE / FRAME_SAMPLES  # 12.5 frames per second
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE  # 0.08 s per frame
N_VQ = 32  # codebooks per frame
AUDIO_VOCAB = 1024  # codes per codebook; code 1024 is the pad code
# names of the tensors a MOSS-Audio-Tokenizer checkpoint's decoder is built from
CODEC_DECODER_PREFIXES = ("decoder.", "quantizer.")
# characters of text one Engine.stream request (synth, speak) takes; the server cuts its text
# into segments first, so its own limits (docs/protocol.md) are the ones its clients meet
MAX_TEXT_CHARS = 20_000
# dialogue (MOSS-TTSD): the text tags each turn with its speaker, [S1] .. [S5] (model card:
# 1 to 5 speakers); reference i of a request is the voice of [S{i+1}]
MAX_SPEAKERS = 5
SPEAKER_TAG_PATTERN = r"\[S(\d+)\]"
