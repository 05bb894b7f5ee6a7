"""Count the skipped tests of a pytest JUnit XML report; under CI they are failures, never passes.

A test counts as skipped when pytest reported it skipped or xfailed (a required part that could not
run), or when tests/conftest.py turned its skip or xfail into a failure because CI is set (its
message starts with "skipped under CI").
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

MARK = "skipped under CI"


def skipped(report: str) -> list[str]:
    found = []
    for case in ET.parse(report).getroot().iter("testcase"):
        for child in case:
            text = f"{child.get('message', '')} {child.text or ''}"
            if child.tag == "skipped" or (child.tag in ("failure", "error") and MARK in text):
                found.append(f"{case.get('classname')}::{case.get('name')}: {child.get('message', '').strip()[:200]}")
                break
    return found


if __name__ == "__main__":
    names = skipped(sys.argv[1])
    print(f"skipped tests: {len(names)}")
    for name in names:
        print(f"  {name}")
    sys.exit(1 if names else 0)
