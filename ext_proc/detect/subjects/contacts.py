"""EMAIL and PHONE forms: every rendering of a declared address or number.

Called by ext_proc.detect.subjects.values for each declared email and phone. An email matches with
any separators, with "at"/"dot" spelled out, with or without its `+tag`, and by a distinctive local
part alone; a phone (read by phonenumbers) by its national, international and as-declared digits.
"""

from __future__ import annotations

import phonenumbers

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.forms import FormList, FormSet, UnreadableValue, unique
from ext_proc.detect.subjects.reading import key_of, segments_of
from ext_proc.detect.subjects.words import is_common_word, word_list

DEFAULT_REGION = "US"  # phonenumbers' region for a declared phone without a `+` country code

ROLE_LOCAL_PARTS = frozenset(
    word_list(
        "info admin administrator support contact sales hello help office mail email team noreply "
        "donotreply postmaster webmaster hostmaster billing abuse security privacy hr jobs careers press "
        "media marketing service enquiries inquiries feedback accounts orders legal news newsletter "
        "root test user"
    )
)


def email_forms(value: str) -> FormList:
    """The forms of one declared email address. Raises UnreadableValue without an `@`."""
    folded = fold(value)
    local, at, domain = folded.rpartition("@")
    if not at or not key_of(local) or not key_of(domain):
        raise UnreadableValue("is not an email address (local part, @, domain)")
    forms = FormSet()
    domain_key = key_of(domain)
    domain_dots = key_of(domain.replace(".", " dot "))
    locals_ = unique([key_of(local), key_of(local.split("+", 1)[0])])
    for local_key in locals_:
        for middle in ("", "at"):
            forms.add(local_key + middle + domain_key)
            forms.add(local_key + middle + domain_dots)
        if len(local_key) >= 4 and not is_common_word(local_key) and local_key not in ROLE_LOCAL_PARTS:
            forms.add(local_key, weak=True)
    return forms.result()


def _digits(text: str) -> str:
    return "".join(s for s in segments_of(text) if s[0].isdigit())


def phone_forms(value: str) -> FormList:
    """The forms of one declared phone number. Raises UnreadableValue if phonenumbers cannot read it."""
    try:
        number = phonenumbers.parse(value, DEFAULT_REGION)
        significant = phonenumbers.national_significant_number(number)
        national = _digits(phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL))
    except Exception:  # phonenumbers raises NumberParseException and, on odd input, others
        raise UnreadableValue("is not a phone number phonenumbers can read") from None
    if not significant or not number.country_code:
        raise UnreadableValue("is not a phone number phonenumbers can read")
    code = str(number.country_code)
    forms = FormSet()
    for form in (
        significant,
        national,
        _digits(fold(value)),
        code + significant,
        "00" + code + significant,
        "011" + code + significant,
        code + national,
    ):
        if form:
            forms.add(form)
    return forms.result()
