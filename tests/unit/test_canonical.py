"""The canonical view (ext_proc.detect.canonical), its offset maps (ext_proc.detect.offsets) and the
decoded views (ext_proc.detect.decode), and what the catalog, the subject matcher and the output
gate read through them. Every value here is invented; assertions name labels and indexes only.
"""

from __future__ import annotations

import string
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.detect.canonical import blank_views, blankings, canonical, read_char
from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.decode import decoded_views
from ext_proc.detect.findings import ALL_SETS, SETS
from ext_proc.detect.normalize import fold
from ext_proc.detect.offsets import EditMap, apply_edits
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.restore.output_gate import OutputGate
from tests.support.examples import example_count

ALL = Catalog.for_sets(SETS)

# Invented values (a Luhn-valid Visa-range number, a mod-97-valid IBAN, a 555-01xx phone).
CARD = "4929 5083 1764 2207"
SSN = "372-81-4406"
PHONE = "+1 312-555-0146"
IBAN = "DE44 5001 0517 5407 3249 31"
EMAIL = "tamsin.rook@example.net"
PERSON = {
    "names": ["Odalys Prewitt-Kaur"],
    "emails": ["okaur@example.org"],
    "phones": ["+1 312-555-0146"],
    "ids": ["ZK7731904"],
}
SUBJECTS = compile_subjects(parse_subject_header(encode_subject_header({"subjects": [PERSON]})))

# --- the view, character by character

READINGS = [
    # invisible and filler code points: removed
    ("Mari\u115fsol", "Marisol"),
    ("Mari\u1160sol", "Marisol"),
    ("Mari\u3164sol", "Marisol"),
    ("Mari\uffa0sol", "Marisol"),
    ("Mari\u2800sol", "Marisol"),
    ("Ma\u200bri\u200d\u2060so\ufeffl\u00ad", "Marisol"),
    ("Ma\u034fri\u180es\ufe0fo\U000e0041l", "Marisol"),
    ("Ma\u061cri\u2066so\u2069l\u202e", "Marisol"),
    ("12\x0734\x7f5", "12345"),
    # look-alikes NFKC keeps: small capitals, modifier letters, other scripts' homoglyphs
    ("ᴍᴀʀɪꜱᴏʟ", "marisol"),
    ("ᴊᴀɴᴇ ʀᴏᴇ", "jane roe"),
    ("ᶦᶜᵉ", "ice"),
    ("Mаrisоl", "Marisol"),  # Cyrillic а and о
    ("Μarisοl", "Marisol"),  # Greek capital mu and omicron
    ("ΡΕΤΕR", "PETER"),  # Greek capitals
    ("Іvan", "Ivan"),  # Cyrillic capital byelorussian-ukrainian i
    ("ѕk-", "sk-"),  # Cyrillic dze
    ("🅞🅓🅐", "ODA"),
    ("🅾🅳🅰", "ODA"),
    ("øłđħŧ", "oldht"),
    # what NFKC already folds
    ("𝐣𝐨𝐡𝐧𝟒𝟐", "john42"),
    ("ⓙⓞⓗⓝ①②", "john12"),
    ("ｊｏｈｎ＠ｅｘａｍｐｌｅ．ｃｏｍ", "john@example.com"),
    ("jo\ufe6bhn", "jo@hn"),
    ("ﬁle", "file"),
    # combining marks go
    ("Jose\u0301 4\u03321\u0332", "Jose 41"),
    ("é", "e"),
    # decimal digits of every script
    ("٤١١١ ۴۱۱۱ ४१११ ৪১১১ ๔๑๑๑ ᠔᠑᠑᠑", "4111 4111 4111 4111 4111 4111"),
    # spaces, dashes, line breaks
    ("4111\u00a01111\u202f1111\u2009\u2007\u3000x", "4111 1111 1111 x"),
    ("a\tb   c", "a b c"),
    ("a\u2013b\u2011c\u2212d\u2014e\u2010f\ufe63g\u2043h", "a-b-c-d-e-f-g-h"),
    ("a\u2028b\u2029c\x85d\ne\r\nf", "a\nb\nc\nd\ne\r\nf"),
    ("code:\n    indented  twice", "code:\n    indented twice"),
    # what stays: ASCII, scripts without look-alikes, visible signs
    ("Straße 가나 日本 ¨ ´", "Straße 가나 日本 ¨ ´"),
    ("Price: 100% (approx.) & more = 5", "Price: 100% (approx.) & more = 5"),
]


@pytest.mark.parametrize(("index", "pair"), list(enumerate(READINGS)), ids=lambda x: str(x)[:24])
def test_the_view_reads_each_disguise(index: int, pair: tuple[str, str]) -> None:
    text, expected = pair
    assert canonical(text).text == expected, f"reading {index}"


@pytest.mark.parametrize(
    "text", ["hello there", "", "a b\nc\r\nd", "x = {'k': [1, 2]}", string.printable[:94]]
)
def test_ascii_without_tabs_controls_or_double_spaces_is_its_own_view(text: str) -> None:
    view = canonical(text)
    assert view.text is text and view.identical
    assert view.span(0, len(text)) == (0, len(text))


ASCII_TEXT = st.text(alphabet=st.sampled_from(" \t\n\r" + string.ascii_letters + string.digits + "@.-_%&=\\"))


@given(ASCII_TEXT)
def test_ascii_view_is_the_text_with_tabs_as_spaces_and_inner_runs_collapsed(text: str) -> None:
    view = canonical(text)
    lines = text.replace("\t", " ").split("\n")
    expected = []
    for line in lines:
        body = line.lstrip(" ")
        while "  " in body:
            body = body.replace("  ", " ")
        expected.append(line[: len(line) - len(line.lstrip(" "))] + body)
    assert view.text == "\n".join(expected)
    if "\t" not in text and "  " not in text:
        assert view.identical


@given(st.text())
@settings(max_examples=example_count(300))
def test_the_view_is_idempotent(text: str) -> None:
    once = canonical(text).text
    assert canonical(once).text == once


@pytest.mark.slow
def test_every_code_point_reads_as_a_fixed_point() -> None:
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        reading = read_char(chr(code))
        assert "".join(map(read_char, reading)) == reading, hex(code)
        assert "\x00" not in reading, hex(code)


# --- offsets

DISGUISES = st.sampled_from(
    [
        "\u200b",
        "\u3164",
        "\u0301",
        "\u00a0",
        "\u202f",
        "  ",
        "\t",
        "\u2013",
        "ﬁ",
        "𝐚",
        "ᴍ",
        "а",
        "٣",
        "\x07",
        "Æ",
    ]
)
PIECES = st.lists(st.one_of(DISGUISES, st.sampled_from(list("ab12 -@.\n"))), max_size=40)


@given(PIECES)
def test_each_view_character_maps_to_the_exact_original_it_was_read_from(pieces: list[str]) -> None:
    """The source ranges of the view's characters, in order, with what lies between them, cut the
    original into pieces; each piece reads as exactly the view characters it made (or nothing)."""
    text = "".join(pieces)
    view = canonical(text)
    ranges = [view_char_range(view, i) for i in range(len(view.text))]
    at = 0
    i = 0
    while i < len(ranges):
        start, end = ranges[i]
        assert start >= at, f"view character {i} starts before the previous one ended"
        assert canonical(text[at:start]).text.strip(" ") == "", f"text before view character {i}"
        j = i
        while j < len(ranges) and ranges[j] == (start, end):
            j += 1
        piece = canonical(text[start:end]).text
        assert squeeze(piece) == squeeze(view.text[i:j]), f"view characters {i}..{j}"
        at, i = end, j
    assert canonical(text[at:]).text.strip(" ") == ""


def squeeze(text: str) -> str:
    """Runs of spaces as one (a piece cut out of its line may read as indentation)."""
    while "  " in text:
        text = text.replace("  ", " ")
    return text


def view_char_range(view: object, index: int) -> tuple[int, int]:
    from ext_proc.detect.canonical import View

    assert isinstance(view, View)
    start, end = index, index + 1
    for mapping in view.maps:
        start, end = mapping.char(start)[0], mapping.char(end - 1)[1]
    return start, end


@given(PIECES, st.data())
def test_a_span_covers_the_characters_of_its_view_span(pieces: list[str], data: st.DataObject) -> None:
    text = "".join(pieces)
    view = canonical(text)
    if not view.text:
        return
    a = data.draw(st.integers(0, len(view.text) - 1))
    b = data.draw(st.integers(a + 1, len(view.text)))
    start, end = view.span(a, b)
    assert 0 <= start < end <= len(text)
    assert view_char_range(view, a)[0] == start
    assert view_char_range(view, b - 1)[1] <= end
    # what follows the span in the original reads as what follows in the view (when the span ends
    # where a character's reading ends: `Æ` reads `AE`, and half of it has no original of its own)
    if b == len(view.text) or view_char_range(view, b) != view_char_range(view, b - 1):
        assert squeeze(canonical(text[end:]).text).lstrip(" ") == squeeze(view.text[b:]).lstrip(" ")


def test_a_combining_mark_goes_with_its_letter() -> None:
    text = "Jose\u0301\u0323 \u200bhere\u200b"
    view = canonical(text)
    assert view.text == "Jose here"
    assert view.span(0, 4) == (0, 6)  # the marks are not left behind on their own
    assert view.span(3, 4) == (3, 6)
    assert view.span(5, 9) == (8, 12)  # an invisible character is not a mark: it stays out


def test_edit_map_lookups() -> None:
    text, mapping = apply_edits("abcdef", [(1, 2, ""), (3, 5, "X"), (5, 6, "yz")])
    assert text == "acXyz"
    assert isinstance(mapping, EditMap)
    assert [mapping.char(i) for i in range(len(text))] == [(0, 1), (2, 3), (3, 5), (5, 6), (5, 6)]
    assert mapping.span(0, 2) == (0, 3)
    assert mapping.touches(2, 3) and mapping.touches(0, 3) and not mapping.touches(0, 2)
    assert apply_edits("abc", []) == ("abc", None)


# --- decoded views

ENCODED_AT = [
    "tamsin.rook%40example.net",
    "tamsin.rook%2540example.net",
    "tamsin.rook&#64;example.net",
    "tamsin.rook&#64example.net",
    "tamsin.rook&#x40;example.net",
    "tamsin.rook&commat;example.net",
    "tamsin.rook&amp;#64;example.net",
    "tamsin.rook\\u0040example.net",
    "tamsin.rook\\u{40}example.net",
    "tamsin.rook\\x40example.net",
    "tamsin.rook\\100example.net",
    "tamsin.rook\\U00000040example.net",
    "tamsin.rook\\N{COMMERCIAL AT}example.net",
    "tamsin.rook\\40 example.net",
    "tamsin.rook=40example.net",
    "tamsin.rook (at) example (dot) net",
    "tamsin.rook[at]example[dot]net",
    "tamsin.rook %5Bat%5D example.net",
    "ｔａｍｓｉｎ.ｒｏｏｋ％４０ｅｘａｍｐｌｅ.ｎｅｔ",
]


@pytest.mark.parametrize("index", range(len(ENCODED_AT)))
def test_every_escape_family_decodes_to_the_address(index: int) -> None:
    text = canonical(ENCODED_AT[index]).text
    views = list(decoded_views(text))
    assert views, f"encoding {index}: no decoded view"
    assert views[-1].text == EMAIL, f"encoding {index}"
    assert views[-1].span(0, len(views[-1].text)) == (0, len(text)), f"encoding {index}"


def test_byte_escapes_read_as_utf8_and_surrogate_pairs_join() -> None:
    views = list(decoded_views("caf%C3%A9 caf=C3=A9 caf\\xc3\\xa9 caf\\303\\251 \\uD83D\\uDE00"))
    assert views[-1].text == "café café café café \U0001f600"


ORDINARY = [
    "It is 100% sure, and 50%off is no code.",
    "if (a == 10 && b != 0x1F) { x = y; }",
    "width=100 height=20 color=#ffaa00 key=41",
    'JSON escapes: "line\\nnext\\tcol" and a path C:\\temp\\new',
    "Regex \\d{3}-\\d{2}-\\d{4} and \\b\\w+\\b",
    "Tom &amp; Jerry &lt;3 &copy; 2024",
    "We met (at) the station [at] noon, see (attached).",
    "x = a % b; y = c & d; z = e = f",
    "Windows paths: C:\\Users\\dev\\Documents\\2024\\1234",
    "LaTeX: \\frac{a}{b} + \\beta \\cdot \\delta",
    "quoted=3D printable=20text and mailto: someone at the office",
]


@pytest.mark.parametrize("index", range(len(ORDINARY)))
def test_ordinary_text_gains_no_finding_from_decoding(index: int) -> None:
    assert ALL.detect(ORDINARY[index]) == [], f"ordinary text {index}"
    assert SUBJECTS.first_survivor(ORDINARY[index]) is None, f"ordinary text {index}"


def test_nothing_to_decode_means_no_view() -> None:
    for text in ("hello there", "a (b) c", "100% sure", "x == y", "\\n"):
        assert list(decoded_views(text)) == []


# --- the catalog reads through both


def found(text: str) -> list[tuple[str, str]]:
    return [(f.kind, text[f.start : f.end]) for f in ALL.detect(text)]


SEPARATORS = {
    "narrow no-break": "\u202f",
    "no-break": "\u00a0",
    "thin": "\u2009",
    "figure": "\u2007",
    "tab": "\t",
    "doubled": "  ",
    "filler": "\u3164",
    "en dash": "\u2013",
    "non-breaking hyphen": "\u2011",
    "minus": "\u2212",
}
DASHES = ("en dash", "non-breaking hyphen", "minus")


@pytest.mark.parametrize("name", list(SEPARATORS))
def test_catalog_values_with_typographic_separators(name: str) -> None:
    sep = SEPARATORS[name]
    values = {
        "CREDIT_CARD": CARD.replace(" ", sep),
        "SSN": SSN.replace("-", sep),
        "PHONE": PHONE.replace("-", sep) if name in DASHES else PHONE.replace(" ", sep),
    }
    if name not in DASHES:  # an IBAN is grouped with spaces only
        values["IBAN"] = IBAN.replace(" ", sep)
    for kind, value in values.items():
        text = f"Here, {kind.lower()}: {value} (end)"
        assert (kind, value) in found(text), f"{kind} with {name}"


@pytest.mark.parametrize(
    "value",
    [
        "٤٩٢٩ ٥٠٨٣ ١٧٦٤ ٢٢٠٧",
        "४९२९ ५०८३ १७६४ २२०७",
        "𝟒𝟗𝟐𝟗 𝟓𝟎𝟖𝟑 𝟏𝟕𝟔𝟒 𝟐𝟐𝟎𝟕",
        "4\u03329\u03322\u03329 5083 1764 2207",
        "4929\u200b5083\u20601764\ufeff2207",
    ],
    ids=["arabic-indic", "devanagari", "math", "combining", "zero-width"],
)
def test_a_card_in_other_digits_or_with_marks(value: str) -> None:
    assert ("CREDIT_CARD", value) in found(f"card {value} ok")


@pytest.mark.parametrize(
    "value",
    [
        "ｔａｍｓｉｎ.ｒｏｏｋ@example.net",
        "𝐭𝐚𝐦𝐬𝐢𝐧.rook@example.net",
        "ᴛᴀᴍꜱɪɴ.rook@example.net",
        "tаmsin.rооk@еxample.net",  # Cyrillic а, о, е
        "tam\u034fsin.rook\ufe6bexample.net",
        "tamsin.ro\u3164ok@example.net",
        *ENCODED_AT,
    ],
)
def test_an_email_in_every_disguise_is_found_whole(value: str) -> None:
    assert ("EMAIL", value) in found(f"write to {value} today")


def test_keys_keep_their_case_in_the_view() -> None:
    key = "AKIAZ3MHQ4EXAMPLE7QK"
    assert ("AWS_ACCESS_KEY", key) in found(f"id {key}")
    disguised = "АKIАZ3MHQ4EXAMPLE7QK"  # Cyrillic А twice
    assert ("AWS_ACCESS_KEY", disguised) in found(f"id {disguised}")
    assert found("id akiaz3mhq4example7qk") == []  # lower case is no key id, in the view either


# --- the subject matcher and the egress check read through both


@pytest.mark.parametrize(
    "text",
    [
        "ᴏᴅᴀʟʏꜱ ᴘʀᴇᴡɪᴛᴛ-ᴋᴀᴜʀ",
        "Оdаlys Prеwitt-Kаur",
        "Oda\u3164lys Pre\u115fwitt-Ka\u1160ur",
        "𝐎𝐝𝐚𝐥𝐲𝐬 𝐏𝐫𝐞𝐰𝐢𝐭𝐭-𝐊𝐚𝐮𝐫",
        "🅞🅓🅐🅛🅨🅢 🅟🅡🅔🅦🅘🅣🅣",
        "312\u202f555\u00a00146",
        "312\u2013555\u20110146",
        "٣١٢٥٥٥٠١٤٦",
        "ZK\u2060773\u00ad1904",
    ],
)
def test_declared_values_are_read_through_the_view(text: str) -> None:
    assert SUBJECTS.first_survivor(text) is not None
    assert SUBJECTS.detect(text), "redaction reads the view too"


@pytest.mark.parametrize(
    "text",
    [
        "ZK773\\u0031904",
        "ZK773\\u{31}904",
        "ZK773\\061904",
        "ZK773\\U00000031904",
        "ZK773\\N{DIGIT ONE}904",
        "ZK773\\31 904",
        "ZK773=31904",
        "ZK773%2531904",
        "ZK773&amp;#49;904",
        "okaur%40example%2Eorg",
    ],
)
def test_the_egress_check_reads_the_decoded_views(text: str) -> None:
    assert SUBJECTS.first_survivor(text) is not None


def test_fold_is_the_case_folded_view() -> None:
    assert fold("ᴏᴅᴀʟʏꜱ") == "odalys"
    assert fold("Оdаlys") == "odalys"
    assert fold("ÆSA") == "aesa"
    assert fold("٣١٢") == "312"


# --- the output gate


def test_the_gate_counts_one_value_in_two_renderings_once() -> None:
    gate = OutputGate(ALL, lambda text: text)
    assert gate.read(f"card {CARD}")
    assert gate.read("card " + CARD.replace(" ", "\u202f"))
    assert gate.read("card " + CARD.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")))
    assert gate.counts() == {"CREDIT_CARD": 1}


def test_a_subject_match_takes_the_combining_marks_on_its_last_letter() -> None:
    text = "Ask Odalys Prewitt-Kaur\u0301\u200b today"
    spans = [(f.start, f.end) for f in SUBJECTS.detect(text)]
    assert spans == [(4, len("Ask Odalys Prewitt-Kaur\u0301"))]


def tags(text: str) -> str:
    """`text` spelled in Unicode tag characters (invisible; a model reads the ASCII they mirror)."""
    return "".join(chr(0xE0000 + ord(c)) for c in text)


def test_text_in_tag_characters_is_read_as_the_ascii_it_mirrors() -> None:
    hidden = tags(f"card {CARD}")
    text = f"Hello {hidden} there"
    assert canonical(text).text == "Hello there"  # invisible: the plain view removes it
    assert found(text) == [("CREDIT_CARD", hidden)]  # the whole run of tags
    assert SUBJECTS.first_survivor(f"ok {tags('ZK7731904')} ok") == "SUBJECT1_ID"


# Modifier letters that imitate no letter: every one of them, between the characters of a value.
_MARK_LETTERS = [
    chr(c)
    for c in range(0x80, 0x30000)
    if unicodedata.category(chr(c)) == "Lm" and not (lambda r: r.isascii() and r.isalnum())(read_char(chr(c)))
]


def test_modifier_letters_between_characters_are_read_as_nothing() -> None:
    assert len(_MARK_LETTERS) > 200
    missed = []
    for mark in _MARK_LETTERS:
        card = mark.join(CARD.replace(" ", ""))
        if found(f"card {card} ok") != [("CREDIT_CARD", card)]:
            missed.append(f"U+{ord(mark):04X} card")
        if SUBJECTS.first_survivor("ask " + mark.join("Prewitt-Kaur")) is None:
            missed.append(f"U+{ord(mark):04X} name")
    assert not missed, missed[:10]


def test_regional_indicators_read_as_their_letters() -> None:
    spelled = "".join(chr(0x1F1E6 + ord(c) - ord("A")) for c in "ZK")
    assert canonical(spelled).text == "ZK"
    assert SUBJECTS.first_survivor(f"id {spelled}7731904") == "SUBJECT1_ID"


# --- an invisible character between a word and a value ------------------------------------------

_SEPARATING = ["\u200b", "\u2800", "\u3164", "\uffa0", "\u180e", "\u2060", "\u00ad"]
_SET_APART = [
    "4539 1488 0343 6467",
    "078-05-1120",
    "10.12.13.14",
    "DE89370400440532013000",
    "jane.roe@example.org",
]


@pytest.mark.parametrize("separator", _SEPARATING, ids=[f"U+{ord(c):04X}" for c in _SEPARATING])
def test_a_value_an_invisible_character_sets_apart_from_a_word_is_found(separator: str) -> None:
    """The canonical view removes the character, gluing the value to the word before it; the
    catalog also reads the view where it is a space (`blank_views`)."""
    catalog = Catalog.for_sets(ALL_SETS)
    for value in _SET_APART:
        text = f"card{separator}{value} ok"
        spans = [text[f.start : f.end] for f in catalog.detect(text)]
        assert any(span.endswith(value) for span in spans), value


def test_blank_views_only_where_an_invisible_character_or_a_number_form_is() -> None:
    assert blank_views("plain ascii, tab\tand newline\n") == []
    assert blank_views("café, naïve") == []
    [view] = blank_views("a\u200bb")
    assert view.text == "a b" and view.span(1, 2) == (1, 2)
    # A footnote mark: read apart with the invisible characters blanked or not.
    assert set(blankings("x\u200b0187\u00b9")) == {"x\u200b0187 ", "x 0187\u00b9", "x 0187 "}
    assert blankings("0187\u00b9") == ["0187 "]
    # Circled digits are a number of their own; beside plain ones, a mark.
    assert blankings("\u2460\u2461 0187\u2460") == ["   0187 "]
    # Invisible characters padding a value inside, and one gluing it to a word.
    assert "id 49\u206129" in blankings("id\u206149\u206129")


def test_the_reading_of_words_keeps_the_characters_that_join_a_word() -> None:
    # (The Hangul filler is also a letter of another script beside Latin ones: a further reading.)
    text = "Ge\u00adb\u00fch\u200cren\u2060x\u200by\u3164z"
    assert blankings(text, within_words=True) == ["Ge\u00adb\u00fch\u200cren\u2060x y z"]
    assert blankings(text)[0] == "Ge b\u00fch ren x y z"


def test_a_number_against_letters_of_another_script_is_read_apart() -> None:
    assert blankings("\u96fb\u8a71 312-555-0146\u3067\u3059") == ["   312-555-0146  "]
    assert blankings("\u96fb\u8a71 \u3067\u3059") == []  # no Latin letter or digit against them


def test_each_number_form_is_read_apart_from_the_others() -> None:
    # A value in subscripts with a superscript footnote: only the footnote is blanked in one reading.
    assert "\u2084\u2080\u2084 " in blankings("\u2084\u2080\u2084\u00b9")
    # A modifier letter the canonical view reads as nothing shows as a separator.
    assert "Dear Marisol" in blankings("Dear\u02d0Marisol")
