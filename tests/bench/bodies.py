"""What the bench sends: Chat Completions bodies dense with catalog and declared-person values, the
X-Cordon-Subject header of 8 people, and `Fresh`, which makes every request's strings new to the
processor so that a line times a cold scan."""

from __future__ import annotations

import itertools
import json
import random

from ext_proc.detect.subjects.header import encode_subject_header
from tests.bench.subjects import FILLER, GIVEN, STREETS, SURNAMES
from tests.support.e2e import PERSON, SAMPLES

KB, MB = 1024, 1024 * 1024
CHAT = "/v1/chat/completions"
TINY_REPLY = {"x-fake-reply": "ok"}  # the upstream answers "ok" instead of echoing the request
# The smallest exchange: one short message, nothing to redact, no subjects (every phase still runs).
TINY_BODY = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi, zzzzzzzz here."}]}'

# Every message of a bench body starts with this mark; `Fresh` rewrites it per request, so each
# request's strings are new to the processor's memo (ext_proc.detect.memo) and the lines time a cold scan.
MARK = b"zzzzzzzz"


class Fresh:
    """The same request with a different 8-letter word at every mark, each call: same size, same
    values, strings never seen before. Both listeners get the same treatment."""

    def __init__(self, template: bytes) -> None:
        if MARK not in template:
            raise ValueError("the request has no mark to vary")
        self.template = template
        self.count = itertools.count(1)

    def __call__(self) -> bytes:
        n, word = next(self.count), []
        for _ in range(len(MARK)):
            n, digit = divmod(n, 26)
            word.append(chr(ord("a") + digit))
        return self.template.replace(MARK, "".join(word).encode())


def next_request(source: bytes | Fresh) -> bytes:
    return source if isinstance(source, bytes) else source()


CATALOG_VALUES = list(SAMPLES.values())
PERSON_VALUES = [*PERSON["names"], *PERSON["emails"], *PERSON["phones"]]


def subject_header() -> str:
    """X-Cordon-Subject declaring 8 people: PERSON and 7 more invented ones, every kind each."""
    others = [
        {
            "names": [f"{GIVEN[i]} {SURNAMES[i]}"],
            "emails": [f"{GIVEN[i].lower()}.{i}@example.com"],
            "phones": [f"+1 404-555-01{i:02d}"],
            "addresses": [f"{1400 + i} {STREETS[i]} Apt {i + 1}, Atlanta"],
            "dates": [f"198{i}-0{i + 1}-1{i}"],
            "ids": [f"B{7654320 + i}"],
            "handles": [f"{GIVEN[i].lower()}{i}b"],
            "other": [f"Project Kestrel {i}"],
        }
        for i in range(1, 8)
    ]
    return encode_subject_header({"ref": "bench", "subjects": [PERSON, *others]})


def prose(size: int, *, seed: int, person: bool) -> str:
    """About `size` characters of ordinary words with a value after every 15 words: the catalog's
    samples in turn; with `person`, every third value is PERSON's name, email or phone instead."""
    rng = random.Random(seed)
    catalog = itertools.cycle(CATALOG_VALUES)
    declared = itertools.cycle(PERSON_VALUES)
    sentences: list[str] = []
    length = 0
    for n in itertools.count(1):
        value = next(declared) if person and n % 3 == 0 else next(catalog)
        words = " ".join(rng.choice(FILLER) for _ in range(15))
        sentence = f"{words.capitalize()} {value}."
        if length + len(sentence) + 1 > size and sentences:
            break
        sentences.append(sentence)
        length += len(sentence) + 1
    return " ".join(sentences)


def chat_body(size: int, *, per_message: int, person: bool = False, marked: str = "all") -> bytes:
    """A Chat Completions request of about `size` bytes, its text in messages of `per_message`.

    `marked`: which messages start with the MARK that `Fresh` varies per request: "all" (every
    string new: a cold scan), "last" (a conversation resending its history with one new turn).
    """
    mark = f"Ref {MARK.decode()}. "
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful support assistant."}]
    total = 120  # the JSON around the messages and the system one
    for i in itertools.count():
        room = min(per_message, size - total - 40 - len(mark))  # 40: a message's own JSON
        if room < 200:
            break
        text = prose(room, seed=i, person=person)
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
        total += len(text) + len(mark) + 40
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Please answer the last question."})
    for message in messages[1:] if marked == "all" else messages[-1:]:
        message["content"] = mark + message["content"]
    return json.dumps({"model": "gpt-4o-mini", "messages": messages}).encode()


def values_in(body: bytes) -> tuple[int, int]:
    """(catalog values, person values) a body carries."""
    text = body.decode()
    return sum(text.count(v) for v in CATALOG_VALUES), sum(text.count(v) for v in PERSON_VALUES)
