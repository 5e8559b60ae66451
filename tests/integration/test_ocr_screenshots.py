"""The screenshot set: every screenshot that shows a declared identifier ends masked (nothing of it
legible to a reading stronger than the masker's) or refused, never forwarded legible.

Screenshots are rendered here (tests/support/screenshots.py `shot_set`): upright in light, dark
and blue themes; low contrast (dark grey on near-black, very light grey on white, mid grey);
turned by right angles and by 45°; skewed 2-20°; in the fonts present and several sizes, PNG and
JPEG. The oracle (`oracle_words`) reads what would be sent, turned back by the angle the test
knows, at 2x and 3x, as it is and in a contrast window about its background, both polarities.

Refusing is allowed, not free: upright light and dark screenshots must be masked, and a
screenshot without an identifier must be forwarded (re-encoded). The last test prints the split
per class (run with `-s` to see it). `make test` runs every third screenshot of the set; the slow
run (`make test-slow`) runs the whole set and one three times as large.
"""

from __future__ import annotations

import base64
import collections
import time

import pytest

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.media.find import fuzzy_pattern
from ext_proc.media.image import FORMATS, MaskError, OcrTimeout
from ext_proc.media.mask import mask_image
from tests.support.screenshots import (
    SHOT_ORDINARY,
    SHOT_PERSON,
    Shot,
    cores_of,
    data_url,
    encode,
    oracle_words,
    render_shot,
    shot_leaks,
    shot_set,
)

SUBJECTS = compile_subjects(parse_subject_header(encode_subject_header({"subjects": [SHOT_PERSON]})))
DETECTORS = [Catalog.for_sets(("pii", "pci", "secrets")).detect, SUBJECTS.detect]
FUZZY = fuzzy_pattern([form.key for form in SUBJECTS.forms()])
# Classes whose every screenshot must be masked, not refused.
MUST_MASK = {("upright", "light"), ("upright", "dark")}

# (set, class) → outcome → count: filled by the tests, reported by the last one of each set.
SPLIT: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
REFUSED: dict[str, list[str]] = collections.defaultdict(list)  # set → names of refused shots


def outcome_of(shot: Shot) -> str:
    """'masked', 'forwarded' (nothing painted) or 'refused'; fails on a legible identifier."""
    data = encode(render_shot(shot), shot.fmt)
    if shot.identifier is not None:
        identifier = shot.identifier
        assert shot_leaks(oracle_words(data, shot.angle, lambda w: shot_leaks(w, identifier)), identifier), (
            f"{shot.name}: the {shot.identifier} must be legible to the oracle to begin with"
        )
    try:
        sent, result = mask_image(
            data_url(data, FORMATS[shot.fmt]), DETECTORS, FUZZY, deadline=time.monotonic() + 120
        )
    except OcrTimeout:
        raise
    except MaskError as refused:
        assert "could not be read" in str(refused) or "still legible" in str(refused), shot.name
        return "refused"
    words = oracle_words(base64.b64decode(sent.split(",", 1)[1]), shot.angle)
    if shot.identifier is not None:
        assert not shot_leaks(words, shot.identifier), f"{shot.name}: the {shot.identifier} went out legible"
    ordinary = [word for word in SHOT_ORDINARY if word in cores_of(words)]
    assert len(ordinary) >= 3, f"{shot.name}: only {len(ordinary)} ordinary words left (masked, not blanked)"
    return "masked" if result.masked_words else "forwarded"


def check(shot: Shot, which: str) -> None:
    outcome = outcome_of(shot)
    SPLIT[(which, shot.kind)][outcome] += 1
    if outcome == "refused":
        REFUSED[which].append(shot.name)
    if shot.identifier is None:
        assert outcome == "forwarded", f"{shot.name}: a screenshot without an identifier was {outcome}"
    elif (shot.kind, shot.theme) in MUST_MASK and shot.angle == 0:
        assert outcome == "masked", f"{shot.name}: a plain upright screenshot was {outcome}"
    else:
        assert outcome in ("masked", "refused"), f"{shot.name}: {outcome}"


def report(which: str) -> None:
    rows = sorted((kind, counts) for (name, kind), counts in SPLIT.items() if name == which)
    print(f"\nscreenshot set ({which}): class, masked / refused / forwarded")
    for kind, counts in rows:
        print(f"  {kind:<14} {counts['masked']:3d} / {counts['refused']:3d} / {counts['forwarded']:3d}")
    for name in REFUSED[which]:
        print(f"  refused: {name}")


# `make test` runs every third screenshot of the set (each class, theme and angle still comes up);
# `make test-slow` runs the whole set of 60+ and one three times as large.
SAMPLE = shot_set()[::3]


@pytest.mark.parametrize("shot", SAMPLE, ids=lambda s: s.name)
def test_a_screenshot_is_masked_or_refused(shot: Shot) -> None:
    check(shot, "sample")


def test_the_sample_split() -> None:
    assert {shot.kind for shot in SAMPLE} == {shot.kind for shot in shot_set()}
    report("sample")


@pytest.mark.slow
@pytest.mark.parametrize("shot", shot_set(), ids=lambda s: s.name)
def test_every_screenshot_of_the_set_is_masked_or_refused(shot: Shot) -> None:
    check(shot, "default")


@pytest.mark.slow
def test_the_default_set_split() -> None:
    """At least 60 screenshots with an identifier; reported per class."""
    shots = shot_set()
    assert sum(shot.identifier is not None for shot in shots) >= 60
    report("default")


@pytest.mark.slow
@pytest.mark.parametrize("shot", shot_set(large=True), ids=lambda s: s.name)
def test_a_larger_set_is_masked_or_refused(shot: Shot) -> None:
    check(shot, "large")


@pytest.mark.slow
def test_the_larger_set_split() -> None:
    report("large")
