"""MOSS-TTSD's own text path (text/ttsd.py): its ``normalize_text``, the merge of one speaker's
consecutive turns and a continuation's text. Each expected value is what OpenMOSS/MOSS-TTSD
``generation_utils.py`` (``normalize_text``, ``_merge_consecutive_speaker_tags``,
``_build_prefixed_text``) returns for the input, run on it once and written down here."""

from __future__ import annotations

import pytest

from streamtts.text.ttsd import merge_speaker_turns, normalize_ttsd, prefixed_text

# input, normalize_text(input), _merge_consecutive_speaker_tags(input)
CASES = [
    ("[S1] Did you hear the news today? [S2] No, what happened? [S1] It rained.",
     "[S1]Did you hear the news today?[S2]No, what happened?[S1]It rained.",
     "[S1]Did you hear the news today?[S2]No, what happened?[S1]It rained."),
    ("[1]你好……今天天气怎么样？？[2]哈哈哈，还不错；就是有点冷：",
     "[S1]你好，今天天气怎么样？[S2][笑]，还不错，就是有点冷。",
     "[1]你好……今天天气怎么样？？[2]哈哈哈，还不错；就是有点冷："),
    ("[S1]Hello -- world...  [S1] Again—and again: yes; no.\n[S2] 'Quoted' “text” (ok) ha ha HA!",
     "[S1]Hello  world。Again，and again, yes, no.[S2]'Quoted' text (ok) [laugh]!",
     "[S1]Hello -- world...Again—and again: yes; no.[S2]'Quoted' “text” (ok) ha ha HA!"),
    ("no tag at all, just text...", "no tag at all, just text。", "no tag at all, just text..."),
    ("[S1] a, [S2] b,, [S2] c。d。e，", "[S1]a.[S2]b.c，d，e。", "[S1]a,[S2]b,,c。d。e，"),
    ("[S1]x[S1]y[S2]z", "[S1]xy[S2]z", "[S1]xy[S2]z"),
    ("", "", ""),
    ("[S1] twenty-one_items ~ fine", "[S1]twentyoneitems  fine", "[S1]twenty-one_items ~ fine"),
    ("[S1] 《书名》【标题】「引用」『书』（注）～", "[S1]书名标题引用书注", "[S1]《书名》【标题】「引用」『书』（注）～"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "normalized", "merged"), CASES)
def test_as_moss_ttsds_generation_utils(text: str, normalized: str, merged: str) -> None:
    assert normalize_ttsd(text) == normalized
    assert merge_speaker_turns(text) == merged


@pytest.mark.parametrize(
    ("dialogue", "want"),
    [
        ("[S1]Now the new line.", "[S1]First prompt words.[S2]Second prompt words.[S1]Now the new line."),
        ("[S2] Then me. [S1] And me.", "[S1]First prompt words.[S2]Second prompt words.Then me.[S1]And me."),
    ],
)
def test_a_continuations_text(dialogue: str, want: str) -> None:
    """Each prompt speaker's transcript tagged (unless it starts with its tag), in speaker
    order, then the dialogue; one speaker's consecutive turns merged."""
    transcripts = {2: "[S2] Second prompt words.", 1: "First prompt words."}
    assert prefixed_text(dialogue, transcripts) == want
