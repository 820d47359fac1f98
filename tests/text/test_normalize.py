"""Tests of streamtts.text.normalize: the official examples, edge cases, properties."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtts.text.normalize import normalize_text

# -- the official examples --------------------------------------------------------------

# (name, input, expected), transcribed from TEST_CASES at the bottom of
# OpenMOSS/MOSS-TTS moss_tts_delay/tts_robust_normalizer_single_script.py.
OFFICIAL_CASES: list[tuple[str, str, str]] = [
    (
        "dot_map_sentence",
        "2026 年 3 月 31 日，安全研究员 Chaofan Shou (@Fried_rice) 发现 Anthropic 的 npm 包中暴露了 .map 文件，",
        "2026年3月31日，安全研究员 Chaofan Shou (@Fried_rice) 发现 Anthropic 的 npm 包中暴露了 .map 文件，",
    ),
    (
        "dot_tokens",
        "别把 .env、.npmrc、.gitignore 提交上去。",
        "别把 .env、.npmrc、.gitignore 提交上去。",
    ),
    (
        "file_names",
        "请检查 bundle.min.js、package.json 和 processing_moss_tts.py。",
        "请检查 bundle.min.js、package.json 和 processing_moss_tts.py。",
    ),
    ("index_d_ts", "index.d.ts 里也有同样的问题。", "index.d.ts 里也有同样的问题。"),
    (
        "version_build",
        "Bug 的讨论可以精确到 v2.3.1 (Build 15)。",
        "Bug 的讨论可以精确到 v2.3.1 (Build 15)。",
    ),
    ("version_rc", "3.0.0-rc.1 还不能上生产。", "3.0.0-rc.1 还不能上生产。"),
    (
        "jar_name",
        "fabric-api-0.91.3+1.20.2.jar 需要单独下载。",
        "fabric-api-0.91.3+1.20.2.jar 需要单独下载。",
    ),
    (
        "url",
        "仓库地址是 https://github.com/instructkr/claude-code",
        "仓库地址是 https://github.com/instructkr/claude-code",
    ),
    ("email", "联系邮箱：ops+tts@example.ai", "联系邮箱：ops+tts@example.ai"),
    ("mention", "@Fried_rice 说这是 source map 暴露。", "@Fried_rice 说这是 source map 暴露。"),
    ("reddit", "去 r/singularity 看讨论。", "去 r/singularity 看讨论。"),
    ("hashtag_chain", "#张雪峰#张雪峰[话题]#张雪峰事件", "#张雪峰#张雪峰[话题]#张雪峰事件"),
    (
        "mention_hashtag_boundary",
        "关注@biscuit0228_并转发#thetime_tbs",
        "关注 @biscuit0228_ 并转发 #thetime_tbs",
    ),
    ("speaker_bracket", "[S1]你好。[S2]收到。", "[S1]你好。[S2]收到。"),
    ("event_bracket", "请模仿 {whisper} 的语气说“别出声”。", "请模仿 {whisper} 的语气说“别出声”。"),
    ("order_bracket", "订单号：[AB-1234-XYZ]", "订单号：[AB-1234-XYZ]"),
    ("struct_headline", "〖重磅〗《新品发布》——现在开始！", "重磅。新品发布。现在开始！"),
    (
        "struct_notice",
        "【公告】今天 20:00 维护——预计 30 分钟。",
        "公告。今天20:00维护。预计30分钟。",
    ),
    ("struct_quote_chain", "『特别提醒』「不要外传」", "特别提醒。不要外传。"),
    (
        "flow_arrow_chain",
        "请求接入 -> 身份与策略判定 -> 域服务处理",
        "请求接入，身份与策略判定，域服务处理",
    ),
    ("flow_arrow_no_space", "A->B", "A，B"),
    ("flow_arrow_unicode", "配置中心→推理编排→运行时执行", "配置中心，推理编排，运行时执行"),
    (
        "flow_arrow_maas_example",
        "MaaS 主链遵循请求接入 -> 身份与策略判定 -> 域服务处理 -> 推理编排 -> 运行时执行的在线数据面结构。Dashboard 不直接承载单次在线推理请求，而是负责统一配置、统一治理、统一运营和统一展示。",
        "MaaS 主链遵循请求接入，身份与策略判定，域服务处理，推理编排，运行时执行的在线数据面结构。Dashboard 不直接承载单次在线推理请求，而是负责统一配置、统一治理、统一运营和统一展示。",
    ),
    ("embedded_title", "我喜欢《哈姆雷特》这本书。", "我喜欢《哈姆雷特》这本书。"),
    ("noise_qe", "真的假的？？？！！！", "真的假的？！"),
    (
        "noise_ellipsis",
        "这个包把 app.js.map 也发上去了......太离谱了！！！",
        "这个包把 app.js.map 也发上去了。太离谱了！",
    ),
    (
        "noise_ellipsis_cn",
        "【系统提示】请模仿{sad}低沉语气，说“今天下雨了……”",
        "系统提示。请模仿{sad}低沉语气，说“今天下雨了。”",
    ),
    ("english_spaces", "This   is   a   test.", "This is a test."),
    ("chinese_spaces", "这 是\u3000一 段  含有多种空白的文本。", "这是一段含有多种空白的文本。"),
    ("mixed_spaces_1", "这是Anthropic的npm包", "这是 Anthropic 的 npm 包"),
    ("mixed_spaces_2", "今天update到v2.3.1了", "今天 update 到 v2.3.1 了"),
    ("mixed_spaces_3", "处理app.js.map文件", "处理 app.js.map 文件"),
    (
        "markdown_link",
        "详情见 [release note](https://github.com/example/release)",
        "详情见 release note https://github.com/example/release",
    ),
    (
        "markdown_heading",
        "# I made a free open source app to help with markdown files",
        "I made a free open source app to help with markdown files",
    ),
    ("list_lines", "- 修复 .map 泄露\n- 发布 v2.3.1", "修复 .map 泄露。发布 v2.3.1"),
    (
        "numbered_lines",
        "1. 安装依赖\n2. 运行测试\n3. 发布 v2.3.1",
        "安装依赖。运行测试。发布 v2.3.1",
    ),
    ("newlines", "第一行\n第二行\n第三行", "第一行。第二行。第三行"),
    ("zero_width_url", "详见 https://x.com/\u200bSafety", "详见 https://x.com/Safety"),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [pytest.param(text, expected, id=name) for name, text, expected in OFFICIAL_CASES],
)
def test_official_example(text: str, expected: str) -> None:
    assert normalize_text(text) == expected
    # The official suite also checks that the output is a fixed point.
    assert normalize_text(expected) == expected


# -- edge cases -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # empty and blank input
        pytest.param("", "", id="empty"),
        pytest.param(" \t\u3000\xa0 ", "", id="only-spaces"),
        pytest.param("\n\r\n \r\n\t\n", "", id="only-line-breaks"),
        # line breaks: CRLF / CR / LF all join lines with a Chinese full stop
        pytest.param(
            "第一行\r\n第二行\r第三行\n第四行", "第一行。第二行。第三行。第四行", id="crlf-cr-lf"
        ),
        pytest.param("Hello\r\n\r\nworld", "Hello。world", id="crlf-blank-line-dropped"),
        pytest.param("你好。\n再见", "你好。再见", id="line-after-full-stop"),
        # zero-width and other invisible characters are dropped
        pytest.param("你\u200b好\ufeff世\u200c界\u200d", "你好世界", id="zero-width"),
        pytest.param("soft\xadhyphen\u2060", "softhyphen", id="format-chars"),
        pytest.param("a\x00b\x07c\x1bd", "abcd", id="control-chars"),
        pytest.param("a\tb", "a b", id="tab-is-a-space"),
        pytest.param("a\ud800b\udfff", "ab", id="lone-surrogates"),
        pytest.param("\ue000私\U000f0000用\U0010fffd", "私用", id="private-use"),
        # markdown, including nested markers
        pytest.param("# 标题\n正文", "标题。正文", id="heading"),
        pytest.param("> - 第一项\n> - 第二项", "第一项。第二项", id="quoted-list"),
        pytest.param("## 1. Title", "Title", id="heading-numbered"),
        pytest.param("- see [docs](https://a.b/c)", "see docs https://a.b/c", id="list-link"),
        pytest.param("[**bold**](https://x.y)", "**bold** https://x.y", id="link-bold-text"),
        pytest.param("> > deep", "> deep", id="one-quote-level-per-pass"),
        pytest.param("#tag 不是标题", "#tag 不是标题", id="hashtag-not-heading"),
        # spaces between scripts
        pytest.param("我 用 Python 写 代码", "我用 Python 写代码", id="cjk-latin-words"),
        pytest.param("我用Python写代码", "我用 Python 写代码", id="cjk-latin-glued"),
        pytest.param("日本語 と English の テキスト", "日本語と English のテキスト", id="kana"),
        pytest.param("共 3 个，版本3.0发布", "共3个，版本3.0发布", id="cjk-digits"),
        pytest.param("你好 ，世界 。", "你好，世界。", id="space-around-zh-punct"),
        pytest.param("Hi , there .", "Hi, there.", id="space-before-ascii-punct"),
        pytest.param("This   is\t\ta  test", "This is a test", id="latin-runs"),
        # protected tokens keep punctuation runs, dashes and arrows inside them
        pytest.param(
            "看 https://example.com/a--b...c!!?x=1->2 吧",
            "看 https://example.com/a--b...c!!?x=1->2 吧",
            id="url-with-punct-runs",
        ),
        pytest.param(
            "发到ops+tts@example.ai吧", "发到 ops+tts@example.ai 吧", id="email-glued-to-cjk"
        ),
        pytest.param("发到 ops+tts@example.ai 吧", "发到 ops+tts@example.ai 吧", id="email"),
        pytest.param("问@user_1看看", "问 @user_1 看看", id="handle"),
        pytest.param("加上#TTS标签", "加上 #TTS标签", id="hashtag-runs-to-space"),
        pytest.param("转发 #话题！！！ 好", "转发 #话题！！！ 好", id="hashtag-keeps-its-punct"),
        pytest.param("打开file.txt看看", "打开 file.txt 看看", id="file"),
        pytest.param("升级到v1.2.3了", "升级到 v1.2.3 了", id="version"),
        pytest.param("see my--notes.txt now", "see my--notes.txt now", id="dashes-in-file"),
        pytest.param("Reply .@elonmusk 看看", "Reply .@elonmusk 看看", id="nested-dot-handle"),
        pytest.param("#话题https://x.com", "#话题https://x.com", id="nested-tag-url"),
        # [...] and {...} are kept
        pytest.param("[laughs] 真的吗？？", "[laughs] 真的吗？", id="bracket-event"),
        pytest.param("{whisper}别出声……", "{whisper}别出声。", id="brace-event"),
        pytest.param("[S1]你好[S2]hello", "[S1]你好[S2]hello", id="speaker-tags"),
        # structural punctuation
        pytest.param("A => B <- C ⇒ D <-> E", "A，B，C，D，E", id="arrows"),
        pytest.param("等等——好 wait -- what", "等等。好 wait。what", id="dash-runs"),
        pytest.param("a - b", "a - b", id="single-hyphen-kept"),
        pytest.param("「一」「二」「三」", "一。二。「三」", id="headline-brackets-two-passes"),
        pytest.param("我喜欢《三体》。《三体》", "我喜欢《三体》。三体", id="titles"),
        # repeated punctuation
        pytest.param("真的？！？！好。。。嗯，，，", "真的？！好。嗯，", id="runs-zh"),
        pytest.param("Wow!! Wait... Why??", "Wow！Wait。Why？", id="runs-ascii"),
        pytest.param("嗯…好", "嗯…好", id="single-ellipsis-kept"),
        pytest.param("Hello.\nWorld", "Hello.。World", id="ascii-stop-then-line"),
    ],
)
def test_edge_case(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "请用温柔的语气朗读，语速稍慢。",
        "The quick brown fox jumps over the lazy dog.",
        "[S1]今天我们发布了 MOSS-TTS 的新版本，欢迎试用！",
        "Don't panic: it's 3:15 pm (UTC), isn't it?",
    ],
)
def test_normal_text_is_unchanged(text: str) -> None:
    assert normalize_text(text) == text


# -- properties -------------------------------------------------------------------------

_WORDS = "你好 今天 天气 我们 模型 语音合成 こんにちは カタカナ hello World TTS Python GPU".split()
_ITEMS = _WORDS + "3 42 2026 3.5 20:00 [S1] [laughs] {whisper} 《三体》 “引号” （括号）".split()
_ITEMS += (
    "https://example.com/a?b=1 ops@example.ai @user_1 #话题 #tag app.js.map v1.2.3 .env".split()
)
_GLUE = ["", " ", "  "]
_ENDS = "。 ！ ？ ， 、 . ! ? , …… ... ！！ ？！ —— ->".split() + [" -> ", " —— "]


@st.composite
def _sentence(draw: st.DrawFn, headline: bool) -> str:
    """A clause that starts with a word, has a few more items, and ends in punctuation."""
    parts = ["【公告】" if headline else "", draw(st.sampled_from(_WORDS))]
    for item in draw(st.lists(st.sampled_from(_ITEMS), max_size=6)):
        parts += [draw(st.sampled_from(_GLUE)), item]
    parts += [draw(st.sampled_from(_ENDS)), draw(st.sampled_from(["", " ", "\n"]))]
    return "".join(parts)


# Typical text: clauses of words, numbers and protected tokens, each ending in
# punctuation, joined by nothing, a space or a line break. Restrictions, where
# the official rules are not idempotent:
# - a headline bracket only opens the text: after "——", "……" or "..." it is
#   not at a sentence start until those have become "。" (a later rule), so a
#   second pass would unwrap it;
# - no line starts with a number or a markdown marker: markers are stripped
#   once per line, and "1 . x" becomes the list item "1. x";
# - no ellipsis directly after another one: "…… ……" gives "。。" first.
_typical_text = st.builds(
    lambda first, rest: first + "".join(rest),
    st.booleans().flatmap(lambda headline: _sentence(headline)),
    st.lists(_sentence(False), max_size=4),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_typical_text)
def test_idempotent_on_typical_text(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once


@settings(max_examples=1500, deadline=None)
@given(st.text(st.characters(exclude_categories=())))
def test_never_raises_and_output_is_clean(text: str) -> None:
    out = normalize_text(text)
    assert isinstance(out, str)
    assert out == out.strip()
    assert "  " not in out
    assert not any(unicodedata.category(ch).startswith("C") for ch in out)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="中文ab1 .。，,!?！？-—>#@/[]{}【】《》\n\u200b"))
def test_never_raises_on_punctuation_soup(text: str) -> None:
    out = normalize_text(text)
    assert "\n" not in out
    assert normalize_text(text) == out  # deterministic


# -- [...] is kept whole: [pause X.Ys] (v1.5), [S1] (dialogue), sound events ------------------

_TAGS = ["[pause 1.5s]", "[pause 0.3s]", "[S1]", "[laughs]", "[a -> b]", "[wow!!!]", "[...]",
         "[a -- b]", "[笑haha]", "[ S1 ]", "[]", "[v1.2.3 #x @y]"]


@pytest.mark.parametrize("tag", _TAGS)
@pytest.mark.parametrize(
    "around", ["Hello {} world.", "你好{}世界。", "{}", "Wait, {}, then go.", "[S1] Hi. {} [S2] Ho."]
)
def test_brackets_pass_unchanged(tag: str, around: str) -> None:
    text = around.format(tag)
    assert normalize_text(text) == text


def test_runs_of_spaces_inside_brackets_collapse() -> None:
    assert normalize_text("a [pause \t 1.5s ] b") == "a [pause 1.5s ] b"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab1 .。，,!?！？-—>#@/{}【】《》中文", max_size=30).filter(lambda s: "  " not in s))
def test_any_bracket_contents_are_kept(contents: str) -> None:
    assert f"[{contents}]" in normalize_text(f"你好 [{contents}] world.")
