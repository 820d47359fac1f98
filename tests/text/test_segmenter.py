"""streamtts.text.segmenter: where streamed text is cut, and that the cuts do not depend on how
the text arrives (whole, or one token at a time)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.text.segmenter import CJK_WEIGHT, Segmenter, SegmenterConfig, split_text


def feed_pieces(text: str, cuts: list[int], cfg: SegmenterConfig | None = None) -> list[str]:
    seg = Segmenter(cfg)
    out: list[str] = []
    prev = 0
    for c in sorted(set(cuts)) + [len(text)]:
        out += seg.feed(text[prev:c])
        prev = c
    return out + seg.flush()


def test_sentences_are_segments() -> None:
    text = "Hello there, my good friend. This is a test of the streaming segmenter! Is it working well?"
    assert split_text(text) == [
        "Hello there, my good friend.",
        "This is a test of the streaming segmenter!",
        "Is it working well?",
    ]


def test_short_sentences_are_merged_up_to_min_chars() -> None:
    assert split_text("Hi. Yes. Okay then, let us go now.") == ["Hi. Yes. Okay then, let us go now."]
    cfg = SegmenterConfig(min_chars=2)
    assert split_text("Hi. Yes. Okay.", cfg) == ["Hi.", "Yes.", "Okay."]


def test_clause_boundaries_need_longer_text() -> None:
    text = "When the long and lazy afternoon finally came to its quiet and golden end at last, we walked home, tired"
    # 67 characters (spaces not counted) up to the first comma, over clause_min_chars=60: cut
    # there; the rest is short.
    assert split_text(text) == [
        "When the long and lazy afternoon finally came to its quiet and golden end at last,",
        "we walked home, tired",
    ]
    assert split_text("Well, yes, of course, sure.") == ["Well, yes, of course, sure."]


@pytest.mark.parametrize(
    "text",
    [
        "The value of pi is about 3.14159 and that is plenty for us.",
        "Visit example.com for the details of the whole thing today.",
        "I met Mr. Smith and Dr. Jones at the station this morning.",
        "Bring fruit, e.g. apples or pears, to the picnic on Sunday.",
        "The author J. R. Tolkien wrote a great many long books.",
        "Numbers like 1,000,000 do not split the sentence at commas.",
    ],
)
def test_no_cut_inside_numbers_urls_abbreviations(text: str) -> None:
    assert split_text(text) == [text]


def test_closing_quotes_stay_with_their_sentence() -> None:
    text = 'He said "this is the end of the story." Then he left the room quietly.'
    assert split_text(text) == ['He said "this is the end of the story."', "Then he left the room quietly."]


def test_cjk_punctuation_needs_no_space() -> None:
    text = "今天天气很好，我们去公园散步吧。明天可能会下雨，记得带伞！你准备好了吗？"
    segs = split_text(text)
    assert segs == ["今天天气很好，我们去公园散步吧。", "明天可能会下雨，记得带伞！", "你准备好了吗？"]
    # a CJK character weighs CJK_WEIGHT: 7 characters are a whole segment at min_chars=20
    assert CJK_WEIGHT * 7 >= 20
    assert split_text("你好世界你好吗。我很好。") == ["你好世界你好吗。", "我很好。"]


def test_newline_is_a_sentence_boundary() -> None:
    assert split_text("A first line that is long enough\nand a second line also long enough") == [
        "A first line that is long enough",
        "and a second line also long enough",
    ]


def test_max_chars_cuts_unpunctuated_text_at_a_space() -> None:
    cfg = SegmenterConfig(max_chars=40)
    text = " ".join(["word"] * 30)
    segs = split_text(text, cfg)
    assert len(segs) > 1
    assert all(len(s.replace(" ", "")) <= 40 for s in segs)
    assert " ".join(segs) == text
    # no spaces at all (CJK): a hard cut
    segs = split_text("字" * 50, cfg)
    assert "".join(segs) == "字" * 50 and all(len(s) * CJK_WEIGHT <= 40 for s in segs)


def test_feed_waits_for_the_character_after_a_boundary() -> None:
    seg = Segmenter()
    assert seg.feed("This sentence is long enough.") == []  # "3.14"? "e.g."? wait and see
    assert seg.feed(" Next") == ["This sentence is long enough."]
    assert seg.pending.strip() == "Next"
    assert seg.flush() == ["Next"]
    assert seg.flush() == []


def test_flush_emits_pending_text_however_short() -> None:
    seg = Segmenter()
    assert seg.feed("Hi") == []
    assert seg.flush() == ["Hi"]
    assert seg.feed("there, friend") == []
    assert seg.flush() == ["there, friend"]


def test_pieces_without_words_are_dropped() -> None:
    assert split_text("...") == []
    assert split_text("   ") == []
    assert split_text("— !") == []
    seg = Segmenter()
    assert seg.feed("Hello there, this is long enough. ...") == ["Hello there, this is long enough."]
    assert seg.flush() == []


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        SegmenterConfig(min_chars=-1).validate()
    with pytest.raises(ValueError):
        Segmenter(SegmenterConfig(max_chars=2))


TEXT_ALPHABET = st.sampled_from(
    list("abcdefgh xyz  ..,,!?;:'\"\n31") + ["Mr.", "e.g.", "3.5", "。", "，", "你", "好", "」", "...", "—"]
)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(TEXT_ALPHABET, min_size=0, max_size=120),
    cuts=st.lists(st.integers(0, 400), max_size=60),
    min_chars=st.integers(0, 30),
    clause=st.integers(0, 70),
    max_chars=st.integers(8, 80),
)
def test_any_split_of_the_text_gives_the_same_segments(
    parts: list[str], cuts: list[int], min_chars: int, clause: int, max_chars: int
) -> None:
    text = "".join(parts)
    cfg = SegmenterConfig(min_chars=min_chars, clause_min_chars=clause, max_chars=max_chars)
    whole = split_text(text, cfg)
    assert feed_pieces(text, [c for c in cuts if c <= len(text)], cfg) == whole
    # one character at a time, like the smallest LLM tokens
    assert feed_pieces(text, list(range(len(text))), cfg) == whole
    # no letter or digit is lost, reordered or duplicated
    assert [c for c in "".join(whole) if c.isalnum()] == [c for c in text if c.isalnum()]
    assert all(s == s.strip() and s for s in whole)


# -- [...], [pause X.Ys] and dialogue turns -------------------------------------------------

BRACKETS = ["[pause 1.5s]", "[laughs loudly]", "[pause 0.3s]", "[whispering, softly.]"]


@pytest.mark.parametrize("max_chars", [8, 12, 20, 40])
def test_no_cut_inside_brackets(max_chars: int) -> None:
    text = "Some words here, then [laughs loudly] and more words [pause 1.5s] go on. [whispering, softly.] end"
    segs = split_text(text, SegmenterConfig(min_chars=0, clause_min_chars=0, max_chars=max_chars))
    for b in ("[laughs loudly]", "[pause 1.5s]", "[whispering, softly.]"):
        assert sum(b in s for s in segs) == 1, segs
    assert " ".join(segs) == text


def test_an_unclosed_bracket_is_plain_text_after_a_while() -> None:
    # punctuation inside an open "[" ends nothing, until MAX_BRACKET_CHARS show it never closes
    assert split_text("An open [ bracket. It never closes, so. " + "x" * 70 + ". Next sentence here.") == [
        "An open [ bracket. It never closes, so. " + "x" * 70 + ".",
        "Next sentence here.",
    ]


def test_a_pause_is_a_cut_point() -> None:
    assert split_text("Hello there my good friend [pause 1.5s] and then some more words follow.") == [
        "Hello there my good friend [pause 1.5s]",
        "and then some more words follow.",
    ]
    # not before punctuation that belongs to the words before it
    assert split_text("Hello there my good friend [pause 1.5s], and then more words follow.") == [
        "Hello there my good friend [pause 1.5s], and then more words follow."
    ]
    # too short for a segment of its own: kept with what follows
    assert split_text("Hi [pause 1s] there, friend.") == ["Hi [pause 1s] there, friend."]


def test_a_long_turn_is_cut_at_a_pause_before_a_sentence_end() -> None:
    cfg = SegmenterConfig(max_chars=60)
    text = "[S1] One sentence of a turn [pause 1s] that goes on. And it goes on and on without end, friend."
    assert split_text(text, cfg) == [
        "[S1] One sentence of a turn [pause 1s]",
        "[S1] that goes on. And it goes on and on without end, friend.",
    ]


def test_dialogue_turns_are_segments() -> None:
    text = "[S1] Hi, how are you doing today, my friend? [S2] Fine, thanks, and how about you? [S1] Good."
    assert split_text(text) == [
        "[S1] Hi, how are you doing today, my friend?",
        "[S2] Fine, thanks, and how about you?",
        "[S1] Good.",
    ]


def test_short_turns_share_a_segment_and_sentences_do_not_cut_a_turn() -> None:
    assert split_text("[S1] Hi. [S2] Yo. [S1] Okay then, so we meet again at last. Really. [S2] Sure.") == [
        "[S1] Hi. [S2] Yo. [S1] Okay then, so we meet again at last. Really.",
        "[S2] Sure.",
    ]


def test_a_long_turn_is_cut_at_sentences_and_continues_with_its_tag() -> None:
    turn = " ".join(f"Sentence {i} of a long turn." for i in range(10))
    text = f"[S1] {turn} [S2] A short answer, friend. [S1] Bye now."
    cfg = SegmenterConfig(max_chars=80)
    segs = split_text(text, cfg)
    assert all(s.startswith(("[S1] ", "[S2] ")) for s in segs)
    assert all(len(s[5:].replace(" ", "")) <= 80 for s in segs)
    s1 = [s for s in segs if s.startswith("[S1]")]
    assert " ".join(s[5:] for s in s1[:-1]) == turn  # cut only at sentence ends
    assert all(s.endswith(".") for s in segs)
    assert segs[-2:] == ["[S2] A short answer, friend.", "[S1] Bye now."]


def test_a_tag_is_never_cut_from_its_words() -> None:
    for text in ("[S1] " + "word " * 40, "[S1]" + "字" * 40, "[S2] " + "long" * 30):
        segs = split_text(text, SegmenterConfig(max_chars=20))
        assert len(segs) > 1
        assert all(s.startswith(text[:4]) and len(s) > 5 for s in segs), segs
    segs = split_text("[S1] a b. [S2] " + "字" * 40, SegmenterConfig(max_chars=20))
    assert segs[0] == "[S1] a b." and all(s.startswith("[S2]") for s in segs[1:])


def test_cjk_dialogue() -> None:
    assert split_text("[S1]你好，今天天气很好。[S2]收到，我们出去走走吧。[S1]好的。") == [
        "[S1]你好，今天天气很好。",
        "[S2]收到，我们出去走走吧。",
        "[S1]好的。",
    ]


def test_the_turn_continues_across_feeds_and_flush() -> None:
    seg = Segmenter()
    assert seg.feed("[S2] Hello there, this is a long") == []
    assert seg.flush() == ["[S2] Hello there, this is a long"]
    assert seg.feed("sentence of mine, which goes on. [S1") == []
    assert seg.feed("] Hi.") == ["[S2] sentence of mine, which goes on."]
    assert seg.flush() == ["[S1] Hi."]


def test_a_lone_tag_is_not_a_segment() -> None:
    assert split_text("[S1] Hello there, you are long enough. [S2]") == [
        "[S1] Hello there, you are long enough."
    ]


DIALOGUE_ALPHABET = st.sampled_from(
    list("abcdefgh xyz  ..,,!?;:\n31[]") + ["[S1]", "[S2] ", "[S3]", "[pause 1.5s]", " [pause 2s] ",
                                          "[laughs]", "Mr.", "3.5", "。", "，", "你", "好"]
)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(DIALOGUE_ALPHABET, min_size=0, max_size=120),
    cuts=st.lists(st.integers(0, 500), max_size=60),
    min_chars=st.integers(0, 30),
    max_chars=st.integers(8, 80),
)
def test_dialogue_any_split_gives_the_same_segments(
    parts: list[str], cuts: list[int], min_chars: int, max_chars: int
) -> None:
    import re

    text = "".join(parts)
    cfg = SegmenterConfig(min_chars=min_chars, clause_min_chars=40, max_chars=max_chars)
    whole = split_text(text, cfg)
    assert feed_pieces(text, [c for c in cuts if c <= len(text)], cfg) == whole
    assert feed_pieces(text, list(range(len(text))), cfg) == whole
    tag = re.compile(r"\[S\d+\]")
    # no letter or digit is lost, reordered or duplicated, but for the tags put back
    assert [c for c in tag.sub("", "".join(whole)) if c.isalnum()] == [
        c for c in tag.sub("", text) if c.isalnum()
    ]
    assert all(s == s.strip() and s for s in whole)
    # once a segment held a tag, each segment after it names its speaker first
    tagged = [i for i, s in enumerate(whole) if tag.search(s)]
    if tagged:
        assert all(tag.match(s) for s in whole[tagged[0] + 1 :])
    for s in whole[:-1]:
        assert not re.search(r"\[S\d+\]\s*\Z", s)  # no tag ends a segment
