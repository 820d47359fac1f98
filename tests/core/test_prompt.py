"""Prompt matrix (contract section 3) with a fake and a real `tokenizers` tokenizer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from streamtts.core.delay import delay_layout
from streamtts.core.prompt import (
    HFTokenizer,
    PromptBuilder,
    PromptSpec,
    TextTokenizer,
    build_prompt,
    build_prompt_ex,
)
from streamtts.core.tokens import TokenIds
from streamtts.errors import ConfigError, InputError, ModelFileError

IDS = TokenIds()
K = IDS.n_vq
PAD = IDS.audio_pad_code

# Qwen-style spellings: published tokenizers name the audio ids differently,
# so the builder must resolve them by id.
NAMES = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    151646: "<|object_ref_start|>",
    151652: "<|vision_start|>",
    151653: "<|vision_end|>",
    151654: "<|vision_pad|>",
    151655: "<|image_pad|>",
    151656: "<|video_pad|>",
    151662: "<|fim_pad|>",
}
OFF = 1_000_000


class FakeTokenizer:
    """Special strings -> their id; every other character -> ord(c) + OFF."""

    def __init__(self, names: dict[int, str] = NAMES, special: bool = True) -> None:
        self.names = names
        self.by_name = {v: k for k, v in names.items()}
        alts = sorted(names.values(), key=len, reverse=True)
        self.pattern = re.compile("(" + "|".join(map(re.escape, alts)) + ")")
        self.special = special

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        parts = self.pattern.split(text) if self.special else [text]
        for part in parts:
            if part in self.by_name and self.special:
                out.append(self.by_name[part])
            else:
                out.extend(ord(c) + OFF for c in part)
        return out

    def id_to_token(self, id: int) -> str | None:
        if id in self.names:
            return self.names[id]
        return chr(id - OFF) if id >= OFF else None


def chars(s: str) -> list[int]:
    return [ord(c) + OFF for c in s]


def _body(ref: str, **f: object) -> str:
    def v(name: str) -> str:
        return "None" if f.get(name) is None else str(f[name])

    return (
        "user\n<user_inst>\n- Reference(s):\n"
        + ref
        + f"\n- Instruction:\n{v('instruction')}\n- Tokens:\n{v('tokens')}\n- Quality:\n{v('quality')}"
        + f"\n- Sound Event:\n{v('sound_event')}\n- Ambient Sound:\n{v('ambient_sound')}"
        + f"\n- Language:\n{v('language')}\n- Text:\n{v('text')}\n</user_inst>"
    )


def _tail() -> list[int]:
    return [IDS.im_end] + chars("\n") + [IDS.im_start] + chars("assistant\n") + [IDS.audio_start]


FIELDS = [
    {},
    {"instruction": "Speak calmly.", "tokens": 125, "quality": "high", "language": "en"},
    {
        "instruction": "x",
        "tokens": 1,
        "quality": "q",
        "sound_event": "rain",
        "ambient_sound": "café",
        "language": "zh",
    },
]


@pytest.mark.parametrize("fields", FIELDS)
def test_prompt_without_reference_exact_rows(fields: dict[str, object]) -> None:
    text = "Hello, 世界 [laugh]."
    p = build_prompt(FakeTokenizer(), IDS, PromptSpec(text=text, **fields))  # type: ignore[arg-type]
    want = [IDS.im_start] + chars(_body("None", text=text, **fields)) + _tail()
    assert p.dtype == np.int64 and p.shape == (len(want), 1 + K)
    np.testing.assert_array_equal(p[:, 0], want)
    assert np.all(p[:, 1:] == PAD)


@pytest.mark.parametrize("fields", FIELDS[:2])
@pytest.mark.parametrize("t", [1, 3, 40])
def test_prompt_with_reference_exact_rows(fields: dict[str, object], t: int) -> None:
    rng = np.random.default_rng(t)
    codes = rng.integers(0, 1024, size=(t, K))
    text = "Hi"
    p = build_prompt(FakeTokenizer(), IDS, PromptSpec(text=text, reference_codes=codes, **fields))  # type: ignore[arg-type]
    head = [IDS.im_start] + chars("user\n<user_inst>\n- Reference(s):\n[S1]:\n")
    block = [IDS.audio_start] + [IDS.user_slot] * (t + K - 1) + [IDS.audio_end]
    rest = _body("", text=text, **fields).split("- Reference(s):\n", 1)[1]
    want = head + block + chars(rest) + _tail()
    np.testing.assert_array_equal(p[:, 0], want)
    start = len(head)
    audio = np.full((len(want), K), PAD)
    audio[start + 1 : start + 1 + t + K - 1] = delay_layout(codes, PAD)
    np.testing.assert_array_equal(p[:, 1:], audio)
    # spot-check the definition: slot row r, channel k carries codes[r - k, k]
    for r in (0, t - 1, t + K - 2):
        for k in (0, K - 1):
            v = p[start + 1 + r, 1 + k]
            assert v == (codes[r - k, k] if 0 <= r - k < t else PAD)
    # no codes on the markers or outside the block
    assert np.all(p[start, 1:] == PAD) and np.all(p[start + t + K, 1:] == PAD)


def test_empty_reference_is_no_reference() -> None:
    a = build_prompt(
        FakeTokenizer(), IDS, PromptSpec(text="a", reference_codes=np.zeros((0, K), np.int64))
    )
    b = build_prompt(FakeTokenizer(), IDS, PromptSpec(text="a"))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_rejected(text: str) -> None:
    with pytest.raises(InputError):
        build_prompt(FakeTokenizer(), IDS, PromptSpec(text=text))


@pytest.mark.parametrize(
    "spec",
    [
        PromptSpec(text="a", reference_codes=np.zeros((3, 31), np.int64)),
        PromptSpec(text="a", reference_codes=np.full((3, K), 1024, np.int64)),
        PromptSpec(text="a", reference_codes=np.full((3, K), -1, np.int64)),
        PromptSpec(text="a", reference_codes=np.zeros((3, K), np.float32)),
        PromptSpec(text="a", tokens=0),
        PromptSpec(text="a", tokens=True),
        PromptSpec(text="say <|im_end|> now"),
        PromptSpec(text="a", instruction="<|vision_start|>"),
    ],
)
def test_bad_inputs_rejected(spec: PromptSpec) -> None:
    with pytest.raises(InputError):
        build_prompt(FakeTokenizer(), IDS, spec)


def test_missing_special_id_names_it() -> None:
    names = dict(NAMES)
    del names[151662]
    with pytest.raises(ConfigError, match="151662"):
        build_prompt(FakeTokenizer(names), IDS, PromptSpec(text="a"))


def test_tokenizer_without_special_handling_is_an_error() -> None:
    with pytest.raises(ConfigError, match="special"):
        build_prompt(FakeTokenizer(special=False), IDS, PromptSpec(text="a"))
    with pytest.raises(ConfigError, match="special"):
        build_prompt(
            FakeTokenizer(special=False),
            IDS,
            PromptSpec(text="a", reference_codes=np.zeros((2, K), np.int64)),
        )


def test_fake_tokenizer_is_a_text_tokenizer() -> None:
    tok: TextTokenizer = FakeTokenizer()
    assert tok.encode("<|im_start|>a") == [151644, ord("a") + OFF]


# -- a real byte-level BPE built with `tokenizers` --------------------------------------

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _write_tokenizer(path: Path, specials_are_added: bool = True) -> Path:
    """A Qwen-shaped byte-level BPE whose special tokens sit at the real ids.

    The BPE is trained in milliseconds on a few lines; the special tokens are
    then placed at ids 151643.. in the (sparse) model vocabulary and declared
    as added tokens, which `tokenizers` accepts without 151k filler entries.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [_body("None", text="Hello world, how are you today?") + "\nassistant\n"] * 3
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    data = json.loads(tok.to_str())
    for i, name in NAMES.items():
        data["model"]["vocab"][name] = i
    if specials_are_added:
        data["added_tokens"] = [
            {
                "id": i,
                "content": name,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, name in sorted(NAMES.items())
        ]
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def real_tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_tokenizer(tmp_path_factory.mktemp("tok"))


def test_real_tokenizer_prompt(real_tok_dir: Path) -> None:
    tok = HFTokenizer(real_tok_dir)
    assert tok.id_to_token(IDS.audio_start) == "<|vision_start|>"
    text = "Hello world, 你好!"
    p = build_prompt(tok, IDS, PromptSpec(text=text, language="en"))
    template = (
        "<|im_start|>"
        + _body("None", text=text, language="en")
        + "<|im_end|>\n<|im_start|>assistant\n"
    )
    np.testing.assert_array_equal(p[:-1, 0], tok.encode(template))
    assert p[-1, 0] == IDS.audio_start
    assert tok.decode(list(p[:-1, 0])) == template.replace("<|im_start|>", "").replace(
        "<|im_end|>", ""
    )
    assert len(p) < len(template)  # the BPE merged something
    assert np.all(p[:, 1:] == PAD)


def test_real_tokenizer_prompt_with_reference(real_tok_dir: Path) -> None:
    tok = HFTokenizer(real_tok_dir / "tokenizer.json")
    codes = np.random.default_rng(0).integers(0, 1024, size=(5, K))
    p = build_prompt(tok, IDS, PromptSpec(text="Hello", reference_codes=codes))
    col = p[:, 0]
    start = int(np.flatnonzero(col == IDS.audio_start)[0])
    end = int(np.flatnonzero(col == IDS.audio_end)[0])
    assert end - start - 1 == 5 + K - 1
    assert np.all(col[start + 1 : end] == IDS.user_slot)
    np.testing.assert_array_equal(p[start + 1 : end, 1:], delay_layout(codes, PAD))
    assert np.count_nonzero(p[:, 1:] != PAD) == codes.size
    assert col[-1] == IDS.audio_start and np.count_nonzero(col == IDS.audio_start) == 2


def test_real_tokenizer_without_added_specials_is_rejected(tmp_path: Path) -> None:
    d = _write_tokenizer(tmp_path / "plain", specials_are_added=False)
    with pytest.raises(ConfigError, match="special"):
        build_prompt(HFTokenizer(d), IDS, PromptSpec(text="Hello"))


def test_hf_tokenizer_missing_or_corrupt_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError) as err:
        HFTokenizer(tmp_path)
    assert err.value.path.endswith("tokenizer.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelFileError) as err2:
        HFTokenizer(bad)
    assert str(bad) in str(err2.value)


# -- the shared prefix (prefix cache) ---------------------------------------------------------


@pytest.mark.parametrize("text", ["Hello world.", " leading space", "\nnewline first", "你好", "- Text:\nx"])
def test_prefix_rows_end_at_the_text_and_are_shared(real_tok_dir: Path, text: str) -> None:
    tok = HFTokenizer(real_tok_dir)
    codes = np.random.default_rng(1).integers(0, 1024, size=(4, K))
    p, n = build_prompt_ex(tok, IDS, PromptSpec(text=text, reference_codes=codes), prefix=True)
    other, n2 = build_prompt_ex(tok, IDS, PromptSpec(text="Another text", reference_codes=codes), prefix=True)
    assert n == n2 > 40
    np.testing.assert_array_equal(p[:n], other[:n])  # same voice and fields: same rows
    assert tok.decode(list(p[n - 3 : n, 0])).endswith("- Text:\n")
    np.testing.assert_array_equal(p, build_prompt(tok, IDS, PromptSpec(text=text, reference_codes=codes)))


def test_prefix_differs_with_voice_or_fields(real_tok_dir: Path) -> None:
    tok = HFTokenizer(real_tok_dir)
    a, na = build_prompt_ex(tok, IDS, PromptSpec(text="Hi", language="en"), prefix=True)
    b, nb = build_prompt_ex(tok, IDS, PromptSpec(text="Hi", language="zh"), prefix=True)
    assert na > 40 and nb > 40 and not np.array_equal(a[: min(na, nb)], b[: min(na, nb)])
    v1 = np.zeros((3, K), np.int64)
    c, nc = build_prompt_ex(tok, IDS, PromptSpec(text="Hi", reference_codes=v1), prefix=True)
    d, nd = build_prompt_ex(tok, IDS, PromptSpec(text="Hi", reference_codes=v1 + 1), prefix=True)
    assert nc == nd and np.array_equal(c[:nc, 0], d[:nd, 0]) and not np.array_equal(c[:nc], d[:nd])
    assert build_prompt_ex(tok, IDS, PromptSpec(text="Hi"))[1] == 0  # only computed when asked


def test_prefix_is_zero_when_the_tokenizer_merges_across_the_boundary() -> None:
    class Merging(FakeTokenizer):
        def encode(self, text: str) -> list[int]:  # merges ":\nX" into one token
            out = super().encode(text)
            for i in range(len(out) - 2):
                if out[i] == ord(":") + OFF and out[i + 1] == ord("\n") + OFF and out[i + 2] == ord("X") + OFF:
                    return out[:i] + [7] + out[i + 3 :]
            return out

    _, n = build_prompt_ex(Merging(), IDS, PromptSpec(text="Xylophone"), prefix=True)
    assert n == 0
    _, n = build_prompt_ex(Merging(), IDS, PromptSpec(text="ylophone"), prefix=True)
    assert n > 0


# -- PromptBuilder: the text tokenised once ----------------------------------------------------


@pytest.mark.parametrize("text", ["Hello world.", " leading space", "trailing space ", "3.14 and 你好", "a\nb"])
def test_builder_gives_build_prompt_ex_rows_and_the_texts_row_count(real_tok_dir: Path, text: str) -> None:
    tok = HFTokenizer(real_tok_dir)
    codes = np.random.default_rng(2).integers(0, 1024, size=(3, K))
    for ref in (None, codes):
        spec = PromptSpec(text=text, reference_codes=ref, language="en")
        built = PromptBuilder(tok, IDS).build(spec, prefix=True)
        rows, n_prefix = build_prompt_ex(tok, IDS, spec, prefix=True)
        np.testing.assert_array_equal(built.rows, rows)
        assert built.prefix_rows == n_prefix > 40
        assert built.text_rows == len(tok.encode(text))


def test_builder_tokenises_each_request_once() -> None:
    class Counting(FakeTokenizer):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def encode(self, text: str) -> list[int]:
            self.calls.append(text)
            return super().encode(text)

    tok = Counting()
    builder = PromptBuilder(tok, IDS)
    first = builder.build(PromptSpec(text="first words"), prefix=True)
    assert sum("first words" in c for c in tok.calls) == 1
    tok.calls.clear()
    second = builder.build(PromptSpec(text="other words"), prefix=True)
    assert len(tok.calls) == 1 and "other words" in tok.calls[0]  # the template pieces: remembered
    assert first.prefix_rows == second.prefix_rows > 0 and second.text_rows == len("other words")
    tok.calls.clear()
    builder.build(PromptSpec(text="other words", language="de"))  # another head: tokenised once
    assert len(tok.calls) == 2
