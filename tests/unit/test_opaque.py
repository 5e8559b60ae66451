"""Opaque tokens (ext_proc.detect.opaque): what counts as one, and what is read in one."""

from __future__ import annotations

import base64
import random

import pytest

from ext_proc.detect.catalog.detectors import DETECTORS
from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import ALL_SETS
from ext_proc.detect.opaque import FIXED_SHAPE_DETECTORS, is_opaque_token
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def test_fixed_shape_detectors_exist() -> None:
    assert {d.name for d in DETECTORS} >= FIXED_SHAPE_DETECTORS


def test_what_is_an_opaque_token() -> None:
    rng = random.Random(1)
    blob = base64.b64encode(rng.randbytes(300)).decode()
    assert is_opaque_token(blob)
    assert is_opaque_token("gAAAAA" + base64.urlsafe_b64encode(rng.randbytes(300)).decode())
    assert is_opaque_token("msg_01XFDUDYJgAACzvnptvVoYEL")
    assert is_opaque_token("toolu_01A09q90qw90lq917835lq9")
    # Words, sentences and identifiers people write are not.
    for text in (
        "customer_record_for_the_quarterly_report_of_the_northern_region_backup_file",
        "Please summarise the ticket for me.",
        "lookup_xyz_rules",
        "call_lookup",
        "a" * 100,
        blob + " and some words",
        "msg_ABCDEFGHIJKLMNOPQRSTUV",  # an id needs digits in it
    ):
        assert not is_opaque_token(text), text[:20]


def check_blobs(count: int) -> None:
    header = {"subjects": [{"names": ["Al Ng"]}, {"names": ["Bo Wu"]}, {"names": ["Jo Ann Lee"]}]}
    subjects = compile_subjects(parse_subject_header(encode_subject_header(header)))
    rng = random.Random(3)
    for _ in range(count):
        blob = base64.b64encode(rng.randbytes(rng.randint(750, 15_000))).decode()
        assert subjects.first_survivor(blob) is None
    # The same sweep read as text would find them: the short forms are there to be found.
    assert subjects.first_survivor("0alng0") is not None


def test_random_blobs_never_spell_a_short_form() -> None:
    """600 blobs of 1-20 KB (3,000 in `make test-slow`): short forms (joins of 2-letter tokens)
    are not read in them."""
    check_blobs(600)


@pytest.mark.slow
def test_random_blobs_never_spell_a_short_form_many() -> None:
    check_blobs(3_000)


def test_a_long_form_or_a_fixed_shape_key_is_still_found_in_a_blob() -> None:
    subjects = compile_subjects(
        parse_subject_header(encode_subject_header({"subjects": [{"names": ["Jo Ann Lee"]}]}))
    )
    rng = random.Random(4)
    blob = base64.b64encode(rng.randbytes(3_000)).decode()
    assert subjects.first_survivor(blob[:500] + "/JoAnnLee/" + blob[500:]) is not None
    key = "sk-proj-" + "".join(rng.choice(_ALPHABET) for _ in range(48))
    fixed = Catalog.for_sets(ALL_SETS).restricted(FIXED_SHAPE_DETECTORS)
    assert [f.kind for f in fixed.detect(blob[:500] + "/" + key + "/" + blob[500:])] == ["OPENAI_KEY"]
    # The open-ended detectors are not in it: a blob is no finding.
    assert fixed.detect(base64.urlsafe_b64encode(rng.randbytes(20_000)).decode()) == []
