"""Opaque tokens: random strings that carry no words, read only for what is long or fixed-shape.

Where it sits: the declared-subject matcher (ext_proc.detect.subjects.matcher) reads such a string
with long forms only, as it reads a media file's base64; the request pipeline
(ext_proc.exchange.pipeline) reads the providers' opaque fields (`OPAQUE_KEYS`) with the
catalog's fixed-shape secrets only.

Agents resend the providers' opaque blobs every turn: a Responses reasoning item's
`encrypted_content`, an Anthropic thinking block's `signature`, the APIs' ids. Random base64
spells any given 3-letter run about once per million characters between two digits, so a
10 KB blob read word by word holds a subject's initials now and then, and the refusal would stick
to the whole conversation. A whole name, an email, a handle, a number of 7 digits or more is
still found in such a token (6 characters and more: chance spells one about once per 10^9), and
so is a key of a fixed shape (`sk-…`, `AKIA…`, a PEM header), which nothing random spells.
"""

from __future__ import annotations

import regex

# The providers' fields whose value is an opaque blob the API produced and reads back.
OPAQUE_KEYS = frozenset({"encrypted_content", "signature"})

# Catalog detectors of a fixed shape (a literal prefix or header): read inside an opaque blob,
# where the open-ended ones (high entropy, a value after its key, any 40-character run as an AWS
# secret key) would only find the blob.
FIXED_SHAPE_DETECTORS = frozenset(
    {
        "pem_private_key_header", "jwt", "anthropic_key", "openai_key", "github_token",
        "slack_token", "slack_webhook", "stripe_key", "google_api_key", "aws_access_key_id",
    }
)  # fmt: skip

# A blob: one unbroken run of the base64 or base64url alphabet, long enough that it is no word.
_BLOB = regex.compile(r"[A-Za-z0-9+/_\-]{64,}={0,2}")
BLOB_MIN_CHARS = 64
# An id of the APIs' kind: a short prefix, `_` or `-`, then at least 16 random letters and digits
# (`msg_01XFDUDYJgAACzvnptvVoYEL`, `rs_68af4030592c…`, `toolu_01A09q90qw90lq917835lq9`).
_PREFIXED_ID = regex.compile(r"[A-Za-z]{1,12}[_\-][A-Za-z0-9]{16,}")
ID_MIN_CHARS = 18
ID_MAX_CHARS = 256


def is_opaque_token(text: str) -> bool:
    """Whether `text`, whole, is a random token: a base64 blob of at least 64 characters mixing
    capitals, small letters and digits, or a prefixed id whose random part holds digits."""
    if len(text) < ID_MIN_CHARS or not text.isascii():
        return False
    if len(text) <= ID_MAX_CHARS and _PREFIXED_ID.fullmatch(text) is not None:
        return sum(c.isdigit() for c in text) >= 2
    if len(text) < BLOB_MIN_CHARS or _BLOB.fullmatch(text) is None:
        return False
    classes = (str.isupper, str.islower, str.isdigit)
    return all(any(test(c) for c in text) for test in classes)
