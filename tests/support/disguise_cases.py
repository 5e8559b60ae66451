"""The cases the disguise tests share: the declared persons and the renderings of each of their
values, catalog values, the sentences they are written in, the bodies of the three APIs, ordinary
sentences in many languages, and the oracle's reading of an outgoing body.

Used by tests/property/test_disguises.py (the request pipeline in-process) and
tests/e2e/test_disguises_property.py (through real Envoy). All values are invented.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import regex

from tests.support.disguises import Disguised, Shape, reveal, squash
from tests.support.e2e import PERSON

# A second invented person, of other shapes than tests.support.e2e.PERSON.
OTHER = {
    "names": ["Teodora Vukasinovic"],
    "emails": ["t.vukasinovic@example.org"],
    "phones": ["+44 20 7946 0321"],
    "addresses": ["455 Kettering Ave NW"],
    "dates": ["1979-03-03"],
    "ids": ["ZK-7731904"],
    "handles": ["teovuk_88"],
    "other": ["Orchid Ledger"],
}

PLACEHOLDER = regex.compile(r"<[A-Z][A-Z0-9_]*_[0-9a-f]{8}_[0-9]+>")


@dataclass(frozen=True, slots=True)
class Value:
    """A rendering to disguise: its label, text and shape, and what the oracle looks for (the
    squashed letters and digits that, found in the outgoing bytes, show the value)."""

    label: str
    text: str
    shape: Shape
    targets: tuple[str, ...]


def _value(label: str, text: str, shape: Shape, *extra: str) -> Value:
    return Value(label, text, shape, (squash(text), *extra))


NAME, FREE, EMAIL = Shape(), Shape(), Shape(email=True)
S1, S2 = "SUBJECT1_", "SUBJECT2_"
# The renderings the subject docs (docs/subjects.md) say are read, each kind of both persons.
IDENTIFIERS = [
    _value(S1 + "NAME", "Marisol Quintero-Vance", NAME, "marisol", "quintero", "vance"),
    _value(S1 + "NAME", "Quintero-Vance, Marisol", NAME, "marisol", "quintero", "vance"),
    _value(S1 + "NAME", "M. Quintero-Vance", NAME, "quintero", "vance"),
    _value(S1 + "NAME", "Marisol Vance", NAME, "marisol", "vance"),
    _value(S1 + "NAME", "Vance", NAME),
    _value(S1 + "EMAIL", "mq@example.com", EMAIL),
    # With a +tag, without changed separators: they are a reported gap (a strict xfail).
    _value(S1 + "EMAIL", "mq+news@example.com", Shape(separators="keep", spacing=False)),
    _value(S1 + "PHONE", "+1 404-555-0187", FREE, "4045550187"),
    _value(S1 + "PHONE", "(404) 555-0187", FREE, "4045550187"),
    _value(S1 + "PHONE", "404.555.0187", FREE),
    _value(S1 + "PHONE", "14045550187", FREE, "4045550187"),
    _value(S1 + "ADDRESS", "1428 Elm Street", FREE, "1428elm"),
    _value(S1 + "ADDRESS", "1428 Elm St Apt 4", FREE, "1428elm"),
    _value(S1 + "DATE", "1986-07-14", FREE),
    _value(S1 + "DATE", "07/14/1986", FREE),
    _value(S1 + "DATE", "14.07.1986", FREE),
    _value(S1 + "DATE", "July 14, 1986", FREE),
    _value(S1 + "DATE", "14 July 1986", FREE),
    _value(S1 + "ID", "A1234567", FREE),
    _value(S1 + "ID", "A-123 45 67", FREE),
    _value(S1 + "HANDLE", "mqvance77", FREE),
    _value(S1 + "OTHER", "Project Bluebird", FREE),
    _value(S2 + "NAME", "Teodora Vukasinovic", NAME, "teodora", "vukasinovic"),
    _value(S2 + "NAME", "T. Vukasinovic", NAME, "vukasinovic"),
    _value(S2 + "EMAIL", "t.vukasinovic@example.org", EMAIL, "tvukasinovic", "vukasinovic"),
    _value(S2 + "PHONE", "+44 20 7946 0321", FREE, "2079460321"),
    _value(S2 + "PHONE", "020 7946 0321", FREE, "2079460321"),
    _value(S2 + "ADDRESS", "455 Kettering Ave NW", FREE, "455kettering"),
    _value(S2 + "ADDRESS", "455 Kettering Avenue", FREE, "455kettering"),
    _value(S2 + "DATE", "3 March 1979", FREE),
    _value(S2 + "DATE", "1979-03-03", FREE),
    _value(S2 + "ID", "ZK-7731904", FREE, "zk7731904"),
    _value(S2 + "HANDLE", "teovuk_88", FREE),
    _value(S2 + "OTHER", "Orchid Ledger", FREE),
]

DIGITS = Shape(letters=False, separators="class", spacing=False)
IBAN = Shape(letters=False, separators="spaces", spacing=False)
MAIL = Shape(separators="keep", spacing=False, email=True)
# Invented catalog values (Luhn-valid cards, valid IBAN check digits, 555-01xx phones).
CATALOG_VALUES = [
    _value("EMAIL", "tamsin.rook@example.net", MAIL, "tamsinrook"),
    _value("EMAIL", "ferdia.quell77@example.org", MAIL, "ferdiaquell77"),
    _value("CREDIT_CARD", "4929 5083 1764 2207", DIGITS),
    _value("CREDIT_CARD", "5412-7534-1209-8829", DIGITS),
    _value("CREDIT_CARD", "3782 822463 10005", DIGITS),
    _value("SSN", "372-81-4406", DIGITS),
    _value("SSN", "219 48 7731", DIGITS),
    _value("PHONE", "+1 312-555-0146", DIGITS),
    _value("PHONE", "415-555-0132", DIGITS),
    _value("IBAN", "DE44 5001 0517 5407 3249 31", IBAN),
    _value("IBAN", "NL91 ABNA 0417 1643 00", IBAN),
]

CARRIERS = [
    "Please keep this on record: {} (thanks).",
    "{}",
    "Notiz für die Akte: {} — bitte prüfen.",
    "Réf. client : {} ; merci de rappeler.",
    "确认信息：{} 。",
    "Line one\n{}\nline three",
    "see {} above",
    "Write to {}—she answers.",  # a dash right after the value
    "«{}»",
    "({})",
    "'{}': on file",
    "\t{}\t",
]


# --- bodies of the three APIs ---------------------------------------------------------------------


def chat_body(text: str, where: str) -> tuple[str, dict[str, Any]]:
    base: dict[str, Any] = {"model": "gpt-test", "messages": [{"role": "user", "content": "Hello."}]}
    if where == "user":
        base["messages"][0]["content"] = text
    elif where == "system":
        base["messages"].insert(0, {"role": "system", "content": text})
    elif where == "parts":
        base["messages"][0]["content"] = [{"type": "text", "text": "Note:"}, {"type": "text", "text": text}]
    elif where == "tool_arguments":
        function = {"name": "lookup", "arguments": json.dumps({"note": text})}
        call = {"id": "call_1", "type": "function", "function": function}
        base["messages"].append({"role": "assistant", "tool_calls": [call]})
    elif where == "metadata_key":
        base["metadata"] = {text: "on file"}
    return "chat", base


def responses_body(text: str, where: str) -> tuple[str, dict[str, Any]]:
    base: dict[str, Any] = {"model": "gpt-test", "input": "Hello."}
    if where == "input":
        base["input"] = text
    elif where == "item":
        base["input"] = [{"role": "user", "content": [{"type": "input_text", "text": text}]}]
    elif where == "instructions":
        base["instructions"] = text
    elif where == "function_output":
        base["input"] = [{"type": "function_call_output", "call_id": "call_1", "output": text}]
    return "responses", base


def messages_body(text: str, where: str) -> tuple[str, dict[str, Any]]:
    base: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hello."}],
    }
    if where == "user":
        base["messages"][0]["content"] = text
    elif where == "system":
        base["system"] = text
    elif where == "blocks":
        base["messages"][0]["content"] = [{"type": "text", "text": text}]
    elif where == "tool_use":
        use = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": text}}
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}
        base["messages"] += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    elif where == "tool_result":
        base["messages"][0]["content"] = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": text}]
    return "messages", base


PLACES = [
    *((chat_body, w) for w in ("user", "system", "parts", "tool_arguments", "metadata_key")),
    *((responses_body, w) for w in ("input", "item", "instructions", "function_output")),
    *((messages_body, w) for w in ("user", "system", "blocks", "tool_use", "tool_result")),
]


def body_of(text: str, place: int) -> tuple[str, dict[str, Any]]:
    build, where = PLACES[place]
    return build(text, where)


def strings(node: Any) -> Iterator[str]:
    """Every string of a JSON document (keys too), and of JSON carried inside its strings."""
    if isinstance(node, str):
        yield node
        if node[:1] in ("{", "["):
            try:
                inner = json.loads(node)
            except ValueError:
                return
            yield from strings(inner)
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def shown(body: bytes, value: Value, disguised: Disguised | None) -> bool:
    """Whether the outgoing `body` still shows `value`, read through the disguise by the oracle;
    text between two placeholders is read apart (a placeholder is no part of a value)."""
    for text in strings(json.loads(body)):
        for piece in PLACEHOLDER.split(text):
            seen = squash(reveal(piece, disguised))
            if any(target in seen for target in value.targets):
                return True
    return False


# Ordinary sentences; some hold near misses of the declared values (`advance` holds `vance`, an elm,
# a bluebird, a project, 404 on its own, a year) that must not be taken for them.
ORDINARY = [
    "Could you summarise the attached report in three bullet points?",
    "We should advance the release by a week; relevance matters more than speed.",
    "The old elm in the courtyard lost two branches in the storm.",
    "A bluebird sat on the fence while the project kick-off ran late.",
    "The server answered 404 for the health endpoint, then recovered at 10:30.",
    "Python 3.11 is about 25% faster than 3.10 on this benchmark.",
    "In 1986 the team shipped its first compiler, written in C.",
    "On 3 March the office closes early for the inventory.",
    "The orchid by the window needs water; the ledger is on the desk.",
    "Error 404 appeared 555 times last week, mostly on mobile.",
    "Kettering is a market town; its station has two platforms.",
    "Merci de relire le chapitre 4 avant la réunion de jeudi.",
    "L'équipe a déjà validé la maquette ; reste à écrire la documentation.",
    "Bitte schick mir die Übersicht bis Freitag, danke schön!",
    "Die Straßenbahn fährt alle 12 Minuten über die Brücke.",
    "¿Podrías traducir este párrafo al español neutro, por favor?",
    "El niño comió 3 manzanas y media en la cocina.",
    "Você pode revisar a seção de instalação até amanhã?",
    "Puoi controllare i test prima del rilascio di venerdì?",
    "Kun je de vergadering naar donderdagmiddag verplaatsen?",
    "Proszę o krótkie podsumowanie spotkania z zespołem.",
    "Děkuji za rychlou odpověď, zítra to opravím.",
    "Yarın sabah toplantıdan önce raporu gönderir misin?",
    "Bạn có thể tóm tắt bài báo này bằng tiếng Việt không?",
    "Kan du skicka filen innan lunch på fredag?",
    "Voisitko tarkistaa käännöksen ennen julkaisua?",
    "Köszönöm a gyors választ, holnap folytatjuk.",
    "Vă rog să verificați secțiunea despre instalare.",
    "Þetta er mjög góð hugmynd, takk fyrir aðstoðina.",
    "Diolch am yr adroddiad, mae'n glir iawn.",
    "Tafadhali fupisha makala hii kwa sentensi tatu.",
    "Bisakah kamu menerjemahkan paragraf ini ke bahasa Inggris?",
    "Пожалуйста, кратко перескажи эту статью на русском языке.",
    "Дякую за допомогу, завтра продовжимо роботу над звітом.",
    "Молим те, пошаљи ми нацрт до петка.",
    "Μπορείς να συνοψίσεις το κείμενο σε τρεις προτάσεις;",
    "Խնդրում եմ թարգմանել այս նախադասությունը։",
    "გთხოვ, მოკლედ შეაჯამე ეს სტატია.",
    "אנא סכם את המאמר הזה בשלוש נקודות.",
    "من فضلك لخص هذا المقال في ثلاث نقاط.",
    "لطفاً این متن را به فارسی ترجمه کن.",
    "कृपया इस लेख का सारांश तीन वाक्यों में दीजिए।",
    "অনুগ্রহ করে এই প্রতিবেদনটি সংক্ষেপে লিখুন।",
    "தயவுசெய்து இந்தக் கட்டுரையைச் சுருக்கமாகக் கூறுங்கள்.",
    "กรุณาสรุปบทความนี้เป็นภาษาไทยสั้น ๆ",
    "请用三句话总结这篇文章，谢谢。",
    "この記事を三行で要約してください。",
    "이 기사를 세 문장으로 요약해 주세요.",
    "እባክዎ ይህን ጽሑፍ በአጭሩ ያጠቃልሉ።",
    "Ẹ jọ̀ọ́, ẹ ṣàkópọ̀ àpilẹ̀kọ yìí ní ṣókí.",
]


# A reported gap: an escape right before the tail of a word that spells a declared token
# (`a%64vance`, `a&#100;vance`) leaves that tail as a word of its own, read as the name.
ESCAPED_TAILS = ("vance",)


def declaration() -> dict[str, Any]:
    """The X-Cordon-Subject declaration of both persons (before encoding)."""
    return {"ref": "disguises", "subjects": [PERSON, OTHER]}


def value_of(text: str) -> Value:
    """The declared identifier or catalog value written `text`."""
    return next(value for value in (*IDENTIFIERS, *CATALOG_VALUES) if value.text == text)
