"""Pronunciation lexicons (text/lexicon.py): whole words, the case rule, CJK substrings,
longest match first, one pass, layers, and every bad lexicon refused naming its entry."""

from __future__ import annotations

import time

import pytest

from streamtts.errors import FieldError
from streamtts.text.lexicon import (
    MAX_ENTRIES,
    MAX_KEY_CHARS,
    MAX_LEXICON_BYTES,
    MAX_REPLACEMENT_CHARS,
    Lexicon,
    apply_lexicons,
    lexicon_id,
)

LEX = {
    "nginx": "engine x",
    "US": "you ess",
    "New York": "new yawk",
    "New York City": "the big apple",
    "e.g.": "for example",
    "重庆": "Chongqing",
    ".NET": "dot net",
    "cat": "kat",
    "&": "and",
}


def read(text: str, *lexicons: dict[str, str]) -> str:
    return apply_lexicons(text, [Lexicon.compile(x) for x in (lexicons or (LEX,))])


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("cats concat cat, cat.", "cats concat kat, kat."),  # whole words only
        ("the cat_x and x_cat and cat2", "the cat_x and x_cat and cat2"),  # _ and digits are word characters
        ("Nginx, NGINX and nginx", "engine x, engine x and engine x"),  # a lower-case key: any case
        ("the US and us", "the you ess and us"),  # a key with a capital: exactly
        ("New York City is in New York.", "the big apple is in new yawk."),  # longest first
        ("New  York", "New  York"),  # a phrase as written (normalisation collapses spaces first)
        ("e.g., this", "for example, this"),
        ("我去重庆了", "我去Chongqing了"),  # CJK: a substring
        ("我在New York工作", "我在new yawk工作"),  # CJK next to a Latin key is a boundary
        ("a .NET app, ASP.NET", "a dot net app, ASP.NET"),
        ("AT&T & co", "AT&T and co"),
        ("", ""),
    ],
)
def test_matching(text: str, want: str) -> None:
    assert read(text) == want


def test_one_pass_replacements_are_not_read_again() -> None:
    assert read("AI and I", {"AI": "A I", "I": "eye"}) == "A I and eye"


def test_exact_case_key_before_a_lower_case_one() -> None:
    lex = {"us": "uss", "US": "you ess"}
    assert read("US us Us", lex) == "you ess uss uss"


def test_layers_earlier_wins_a_tie_longest_wins_across() -> None:
    request = {"smith": "smithe", "New": "noo"}
    server = {"smith": "smyth", "New York": "new yawk", "tomato": "tomahto"}
    assert read("Smith from New York likes tomato", request, server) == "smithe from new yawk likes tomahto"
    # a key mapped to itself reads as written: it overrides a layer below
    assert read("Smith", {"Smith": "Smith"}, server) == "Smith"


def test_an_id_is_the_content() -> None:
    assert lexicon_id({"a": "b", "c": "d"}) == lexicon_id({"c": "d", "a": "b"}) != lexicon_id({"a": "b"})
    assert lexicon_id({"a": "b"}).startswith("lx_") and len(lexicon_id({"a": "b"})) == 27


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ([["a", "b"]], "lexicon must be a JSON object mapping words to how they are read"),
        ("nginx", "got a string"),
        ({"nginx": ""}, 'lexicon["nginx"]: the replacement is empty'),
        ({"nginx": "  "}, 'lexicon["nginx"]: the replacement is empty'),
        ({"nginx": 3}, 'lexicon["nginx"]: the replacement must be a string, got a number'),
        ({"nginx": ["engine"]}, 'lexicon["nginx"]: the replacement must be a string, got an array'),
        ({"": "x"}, 'lexicon[""]: a key must be a non-empty word or phrase'),
        ({" cat": "x"}, 'lexicon[" cat"]: the key starts or ends with a space'),
        ({"a" * (MAX_KEY_CHARS + 1): "x"}, f"the key is {MAX_KEY_CHARS + 1} characters; the limit is {MAX_KEY_CHARS}"),
        ({"cat": "x" * (MAX_REPLACEMENT_CHARS + 1)}, f'lexicon["cat"]: the replacement is {MAX_REPLACEMENT_CHARS + 1} characters'),
        ({"cat": "k\nat"}, 'lexicon["cat"]: control characters'),
        ({f"w{i}": "x" for i in range(MAX_ENTRIES + 1)}, f"lexicon has {MAX_ENTRIES + 1} entries; the limit is {MAX_ENTRIES}"),
        ({"a": "b", "b": "a"}, 'lexicon["a"]: a cycle: "a" -> "b" -> "a"'),
        ({"a": "say b", "b": "c d", "d": "not a"}, 'a cycle: "a" -> "b" -> "d" -> "a"'),
        ({"Java": "Java language"}, 'lexicon["Java"]: a cycle: "Java" -> "Java"'),
    ],
)
def test_bad_lexicons_name_the_entry(entries: object, needle: str) -> None:
    with pytest.raises(FieldError) as info:
        Lexicon.compile(entries)
    assert info.value.field == "lexicon"
    assert needle in str(info.value), str(info.value)


def test_total_size_is_bounded() -> None:
    big = {f"w{i}": "y" * MAX_REPLACEMENT_CHARS for i in range(MAX_LEXICON_BYTES // MAX_REPLACEMENT_CHARS + 1)}
    assert len(big) <= MAX_ENTRIES
    with pytest.raises(FieldError, match=f"lexicon is over {MAX_LEXICON_BYTES} bytes"):
        Lexicon.compile(big)


def test_errors_name_the_source() -> None:
    with pytest.raises(FieldError, match=r'^lex\.json\["x"\]: the replacement is empty'):
        Lexicon.compile({"x": ""}, what="lex.json")


def test_a_chain_is_allowed_and_not_followed() -> None:
    assert read("a b", {"a": "b c", "b": "d"}) == "b c d"


def test_the_largest_lexicon_is_fast() -> None:
    entries = {f"word{i}": f"w {i}" for i in range(MAX_ENTRIES)}
    t0 = time.perf_counter()
    lex = Lexicon.compile(entries)
    compiled = time.perf_counter() - t0
    text = "hello world word5 this is word9999, a test. " * 100
    t0 = time.perf_counter()
    out = apply_lexicons(text, [lex])
    applied = time.perf_counter() - t0
    assert out.count("w 5 ") == 100 and out.count("w 9999,") == 100
    assert compiled < 2.0 and applied < 0.2, (compiled, applied)  # measured: ~0.1 s and ~2 ms
