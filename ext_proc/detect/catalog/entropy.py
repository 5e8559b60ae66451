"""HIGH_ENTROPY and AWS secret keys: tokens judged by how random they look.

`Catalog.detect` calls these validators (through `VALIDATORS`) on the matches of the HIGH_ENTROPY
and AWS secret key detectors. `validate_high_entropy` splits a candidate token (at `=`, and in a
path or URL into segments) and keeps the pieces `is_high_entropy` accepts: random enough for their
length, and none of the random-looking things that are not secrets (UUIDs, identifiers made of
words, sequences, ids the LLM APIs issue, media as base64, paths). `validate_aws_secret` reads a
40-character token as an AWS secret access key.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Iterable

import regex

from ext_proc.detect.canonical import canonical_text
from ext_proc.detect.catalog.options import Options
from ext_proc.detect.catalog.regexes import (
    Span,
    compile_pattern,
    timed_all,
    timed_fullmatch,
    timed_match,
    timed_search,
)
from ext_proc.detect.decode import deepest_view
from ext_proc.media.parts import MEDIA_MIN_LENGTH, is_media_base64

HEX_MIN_ENTROPY = 3.0
BASE64_ENTROPY_CAP = 4.3
BASE64_ENTROPY_SLOPE = 0.88
HIGH_ENTROPY_MIN_LENGTH = 20
# Ids the LLM APIs issue for their own objects (tool calls, messages, completions, files): they
# travel in every agent conversation and identify no one.
PROVIDER_ID_PREFIXES: tuple[str, ...] = (
    "toolu_", "srvtoolu_", "msg_", "msgbatch_", "wrkspc_", "req_", "call_", "chatcmpl-",
    "resp_", "run_", "thread_", "asst_", "file-", "file_", "batch_", "fc_", "rs_", "ws_",
    "step_", "vs_", "ftjob-", "evt_", "sess_", "rlg_",
)  # fmt: skip
# A token at least this much made of word-like runs (and separated numbers) is an identifier.
WORD_COVERAGE_LIMIT = 0.6
AWS_SECRET_MIN_ENTROPY = 4.2


def shannon_entropy(value: str) -> float:
    """Bits per character of `value`'s own character distribution."""
    if not value:
        return 0.0
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


_AWS_CONTEXT = compile_pattern(r"(?i)aws|secret|access[_\-. ]?key")


def validate_aws_secret(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    token = text[span[0] : span[1]]
    has_upper = any(ch.isupper() for ch in token)
    has_lower = any(ch.islower() for ch in token)
    has_digit = any(ch.isdigit() for ch in token)
    if not (has_upper and has_lower):
        return ()  # hex digests and other single-case tokens
    line_start = text.rfind("\n", max(0, span[0] - 64), span[0]) + 1
    window_start = max(line_start, span[0] - 64)
    if timed_search(_AWS_CONTEXT, text, window_start, span[0]) is not None and has_digit:
        return (span,)
    if (
        has_digit
        and ("/" in token or "+" in token)
        and not is_path(token)
        and shannon_entropy(token) >= AWS_SECRET_MIN_ENTROPY
    ):
        return (span,)
    return ()


_ENTROPY_PIECE = compile_pattern(r"[A-Za-z0-9+/_\-]{20,}+=*+")
_UUID = compile_pattern(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX = frozenset("0123456789abcdefABCDEF")


def base64_entropy_threshold(length: int) -> float:
    return min(BASE64_ENTROPY_CAP, BASE64_ENTROPY_SLOPE * math.log2(length))


def is_high_entropy(token: str) -> bool:
    """The HIGH_ENTROPY decision for one candidate token (padding included or not).

    Pure, so tokens of ordinary length are cached: conversations resend their history.
    """
    if len(token) <= 256:
        return _is_high_entropy_cached(token)
    return _is_high_entropy(token)


@functools.lru_cache(maxsize=16384)
def _is_high_entropy_cached(token: str) -> bool:
    return _is_high_entropy(token)


def _is_high_entropy(token: str) -> bool:
    token = token.rstrip("=")
    if len(token) < HIGH_ENTROPY_MIN_LENGTH:
        return False
    if not any(ch.isdigit() for ch in token) or not any(ch.isalpha() for ch in token):
        return False
    if timed_fullmatch(_UUID, token):
        return False
    if _sequential_share(token) >= 0.5:
        return False  # ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789
    if all(ch in _HEX for ch in token):
        return shannon_entropy(token) >= HEX_MIN_ENTROPY
    if "/" in token and not any(ch.isupper() for ch in token):
        return False  # a lower-case path, not base64
    if _word_coverage(token) >= WORD_COVERAGE_LIMIT:
        return False  # PytestRemovedIn10Warning: words and numbers
    if token.startswith(PROVIDER_ID_PREFIXES):
        return False  # toolu_01…, msg_01…, chatcmpl-…: object ids the LLM APIs themselves issue
    if len(token) >= MEDIA_MIN_LENGTH and is_media_base64(token):
        return False  # an image or document as base64 (a tool's input): media bytes, not a key
    return shannon_entropy(token) >= base64_entropy_threshold(len(token))


def _sequential_share(token: str) -> float:
    """Share of `token` in runs of 4+ consecutive code points (abcd, 0123, ZYXW)."""
    run = 1
    total = 0
    for prev, cur in itertools.pairwise(token):
        if abs(ord(cur) - ord(prev)) == 1:
            run += 1
        else:
            if run >= 4:
                total += run
            run = 1
    if run >= 4:
        total += run
    return total / len(token)


_WORDISH = compile_pattern(r"[A-Z][a-z]{2,}|[a-z]{3,}|(?<![A-Za-z0-9])[A-Z]{3,}(?![A-Za-z0-9])")
_VOWELS = frozenset("aeiouyAEIOUY")


def _word_coverage(token: str) -> float:
    """Share of `token` in runs that read like words (a vowel, 3+ letters) or like numbers."""
    covered = 0
    for m in timed_all(_WORDISH, token):
        start, end = m.span()
        # A word has a vowel; a whole snake_case or kebab-case segment reads as one without
        # (grpc_status).
        whole_segment = (start == 0 or token[start - 1] in "_-") and (end == len(token) or token[end] in "_-")
        if whole_segment or any(ch in _VOWELS for ch in m.group()):
            covered += end - start
    covered += sum(m.end() - m.start() for m in timed_all(_NUMBER_RUN, token))
    return covered / len(token)


_NUMBER_RUN = compile_pattern(
    r"[0-9]{4,}|(?<![A-Za-z0-9])[0-9]{2,3}(?![A-Za-z0-9])|(?<=[A-Za-z])[0-9]{1,3}(?=[A-Z_\-]|\Z)"
)


def validate_high_entropy(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    # `=` is base64 padding at the end of a token and an assignment inside a run
    # ("access_token=eyJ…"): each piece is judged alone, with its trailing padding.
    if _escapes_of_words(text, span):
        return
    start = span[0]
    if start > 0 and text[start - 1] == "\\":
        # "\x12grpc_status_filter": an escape sequence, then the token.
        escape = timed_match(_ESCAPE, text, start, span[1])
        if escape is not None:
            start = escape.end()
    for piece in timed_all(_ENTROPY_PIECE, text, start, span[1]):
        value = piece.group()
        if len(value) >= MEDIA_MIN_LENGTH and is_media_base64(value):
            continue  # an image or document as base64, before any `/` in it is taken for a path
        if _named_digest(text, piece.start(), value):
            continue  # `commit 9fceb02…`, `@sha256:e3b0…`, `sha512-Q2hl…`: a digest, named so
        if "/" in value and is_path(value):
            # A URL or file path: only a long segment of it can be a secret.
            for segment in timed_all(_PATH_SEGMENT, text, piece.start(), piece.end()):
                if is_high_entropy(segment.group()):
                    yield segment.span()
        elif is_high_entropy(value):
            yield piece.span()


# A digest says what it is: its algorithm or role just before it (`sha256:`, `md5 `, `commit `,
# `checksum=`), or an integrity string's algorithm prefix (`sha512-…`). A hex digest is as long as
# its algorithm makes it; an integrity string is base64.
_DIGEST_NAME = compile_pattern(
    r"(?i)(?:\b(?:sha-?(?:1|224|256|384|512)?|md5|blake2[bs]?|commit|checksum|digest|hash|etag|"
    r"revision|rev|integrity|fingerprint)|@sha256)[\s:=\"'@#-]{0,3}\Z"
)
_INTEGRITY = compile_pattern(r"sha(?:1|256|384|512)-[A-Za-z0-9+/]+=*")
_DIGEST_HEX_LENGTHS = frozenset({32, 40, 56, 64, 96, 128})


def _named_digest(text: str, start: int, value: str) -> bool:
    if timed_fullmatch(_INTEGRITY, value):
        return True
    if len(value) not in _DIGEST_HEX_LENGTHS or not all(ch in _HEX for ch in value):
        return False
    before = text[max(0, start - 24) : start]
    return timed_search(_DIGEST_NAME, before) is not None


_PATH_SEGMENT = compile_pattern(r"[^/]{20,}+")
_ESCAPE = compile_pattern(r"x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{1,3}|[nrtabfv]")
_PLAIN_WORD = compile_pattern(r"[A-Za-z][a-z]{2,}|[a-z]{3,}")


def is_path(token: str) -> bool:
    """At least two `/`-separated segments are plain words: a path, not base64 with slashes."""
    words = 0
    for segment in token.split("/"):
        if timed_fullmatch(_PLAIN_WORD, segment) and any(ch in _VOWELS for ch in segment):
            words += 1
    return words >= 2


_WORD_AROUND = compile_pattern(r"\S*+")


def _escapes_of_words(text: str, span: Span) -> bool:
    """Whether the candidate is escape notation in a word that reads as no random token once
    decoded (`%5Cu006f` + letters: an escaped letter inside an ordinary word): the notation's hex
    digits mixed with letters look random, the word they write does not. A real secret written
    with escapes (`%2B`, `%2F` in base64) is still random once decoded."""
    start, end = span
    word_start = text.rfind(" ", 0, start) + 1
    word = timed_match(_WORD_AROUND, text, word_start)
    region = text[word_start : max(end, word.end() if word is not None else end)]
    last = deepest_view(region)
    if last is None:
        return False
    pieces = [p.group() for p in timed_all(_ENTROPY_PIECE, canonical_text(last.text))]
    return not any(is_high_entropy(piece) for piece in pieces)
