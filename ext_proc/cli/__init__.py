"""Command-line tools beside `serve`: `scan` (the detectors on a platform team's own samples)."""
