"""A small Qwen3-shaped byte-level BPE tokenizer for the demo model.

Why it exists: the engine resolves every special token by id, exactly as it
must for the published MOSS-TTS tokenizer, so the demo tokenizer has to hold
the same special ids (151643..151668) while building in well under a second.

Layout of the vocabulary (the model ids, then the added tokens):

- ids 0..255: the 256 byte symbols of the GPT-2 byte-to-unicode map, so any
  UTF-8 text encodes (byte-level BPE never has an unknown token);
- then the merges of a BPE trained in milliseconds on a fixed corpus (the
  prompt template and a few hundred common English words), so prompts are not
  one token per byte; same corpus, same merges, so the file is deterministic;
- then unreachable filler entries (no merge produces them) up to id 151642,
  the size of the real Qwen3 BPE vocabulary;
- then 26 added tokens at 151643..151668, Qwen3's special-token block.

The audio ids (151652, 151653, 151654, 151656, 151662) are deliberately
spelled differently from ``<|audio_start|>`` etc. (see ``AUDIO_TOKEN_NAMES``):
the contract says published tokenizer files name some of these ids
differently, so an engine that hard-codes spellings fails with the demo model
too instead of failing only on real weights.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

log = logging.getLogger(__name__)

#: Size of the BPE model vocabulary (Qwen3: the added tokens start here).
BPE_VOCAB_SIZE = 151643

#: Spellings of the audio special tokens in the demo tokenizer (by id). They
#: differ on purpose from the names used in the MOSS code (``<|audio_start|>``).
AUDIO_TOKEN_NAMES: dict[int, str] = {
    151652: "<|AUDIO_START|>",
    151653: "<|AUDIO_END|>",
    151654: "<|AUDIO_USER_SLOT|>",
    151656: "<|AUDIO_GEN_SLOT|>",
    151662: "<|AUDIO_DELAY_SLOT|>",
}

# Qwen3's added-token block; the audio ids are replaced by AUDIO_TOKEN_NAMES.
# (name, special) in id order from 151643.
_QWEN3_ADDED: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# Qwen2/Qwen3 pre-tokenisation split (words, single digits, punctuation runs, spaces).
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: Size of the trained part of the vocabulary (bytes + merges).
_TRAINED_VOCAB = 2000

# The prompt template (contract section 3), so prompts tokenise compactly.
_TEMPLATE = (
    "user\n<user_inst>\n- Reference(s):\nNone\n- Instruction:\nNone\n"
    "- Tokens:\nNone\n- Quality:\nNone\n- Sound Event:\nNone\n- Ambient Sound:\nNone\n"
    "- Language:\nen\n- Text:\n\n</user_inst>\nassistant\n"
)

# Common words for the BPE training corpus.
_WORDS = (
    "user assistant Reference Instruction Tokens Quality Sound Event Ambient Language Text "
    "None inst user_inst "
    "the be to of and a in that have it for not on with he as you do at this but his by from "
    "they we say her she or an will my one all would there their what so up out if about who "
    "get which go me when make can like time no just him know take people into year your good "
    "some could them see other than then now look only come its over think also back after use "
    "two how our work first well way even new want because any these give day most us is are "
    "was were has had been said hello world speech voice model stream streaming demo audio "
    "test testing sentence words quick brown fox jumps lazy dog today weather morning evening "
    "thank thanks please yes okay here where why very much many more less long short text "
    "speak speaking read reading story once upon there lived little house small big great "
    "number numbers one two three four five six seven eight nine ten hundred thousand"
)


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


def _training_corpus() -> list[str]:
    lines = [_TEMPLATE]
    for word in _WORDS.split():
        cap = word[:1].upper() + word[1:]
        lines.append(f"{word} {word} {cap} {cap},")
    return lines * 2


def _build_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a small BPE on a fixed corpus, then pad its vocabulary with fillers.

    The tokenizers BPE trainer is deterministic for a given corpus (ties are
    broken by the pair itself) and takes milliseconds on this corpus.
    """
    small = Tokenizer(models.BPE())
    small.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=_TRAINED_VOCAB,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    small.train_from_iterator(_training_corpus(), trainer)
    model = json.loads(small.to_str())["model"]
    vocab: dict[str, int] = {str(k): int(v) for k, v in model["vocab"].items()}
    merges = [(str(a), str(b)) for a, b in model["merges"]]
    if len(vocab) > BPE_VOCAB_SIZE or sorted(vocab.values()) != list(range(len(vocab))):
        raise RuntimeError("demo tokenizer: trained vocabulary is not a dense id range")
    n = len(vocab)
    while n < BPE_VOCAB_SIZE:
        # Unreachable fillers: no merge produces them, and they are not added tokens.
        vocab[f"<|demo_filler_{n}|>"] = n
        n += 1
    return vocab, merges


def added_tokens() -> list[tuple[int, str, bool]]:
    """(id, spelling, special) of the added-token block 151643..151668."""
    out: list[tuple[int, str, bool]] = []
    for i, (name, special) in enumerate(_QWEN3_ADDED):
        tid = BPE_VOCAB_SIZE + i
        out.append((tid, AUDIO_TOKEN_NAMES.get(tid, name), special))
    return out


def build_tokenizer() -> Tokenizer:
    """Build the demo tokenizer in memory (deterministic, ~0.5 s)."""
    from tokenizers import AddedToken

    vocab, merges = _build_vocab_and_merges()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    for tid, name, special in added_tokens():
        # Added one at a time so each lands on the next id, in order.
        n = tok.add_tokens([AddedToken(name, special=special, normalized=False)])
        if n != 1 or tok.token_to_id(name) != tid:
            raise RuntimeError(
                f"demo tokenizer: {name} landed on {tok.token_to_id(name)}, not {tid}"
            )
    return tok


def _tokenizer_config() -> dict[str, object]:
    decoder = {
        str(tid): {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for tid, name, special in added_tokens()
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_tokenizer(out_dir: str | Path) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    path = out / "tokenizer.json"
    tok.save(str(path), pretty=False)
    (out / "tokenizer_config.json").write_text(
        json.dumps(_tokenizer_config(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    log.debug("wrote demo tokenizer (%d tokens) to %s", tok.get_vocab_size(), path)
    return path
