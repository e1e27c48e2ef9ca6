"""The project explains itself in its own words: no tracker references in
code, docs or results.  A number in someone's tracker tells a reader of the
code nothing they can open; the reason belongs where the reference stood."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The word issue (or issues) before a number, with or without a hash, or a hash and a number in
# parentheses: a tracker's numbering; and the words for a ticket spoken of as if the reader had it open.
TRACKER = re.compile(r"\b[Ii]ssues?\s*#?\d+|\(#\d+\)|\b[Tt]he issue(?:'s)?\b")
# What a checkout does not hold: venvs, caches, a user's own runs, test logs (.gitignore).
NOT_OURS = {".git", "__pycache__", "runs", "test-logs", "build", "dist"}


def _text_files():
    """Every text file of the checkout, relative to it (binary files, run files and figures, left out)."""
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [
            d
            for d in dirs
            if d not in NOT_OURS
            and not d.startswith((".venv", ".pytest_cache", ".eggs"))
            and not d.endswith(".egg-info")
        ]
        for name in names:
            path = Path(folder, name)
            data = path.read_bytes()
            if b"\0" not in data[:8192]:
                yield path.relative_to(ROOT), data.decode(errors="replace")


def test_no_text_file_cites_the_tracker():
    found = [
        f"{name}:{number}: {line.strip()[:100]}"
        for name, text in _text_files()
        for number, line in enumerate(text.splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not found, "say it in the project's own words:\n" + "\n".join(found)
