"""Fixtures of the analysis tests."""

from __future__ import annotations

import pytest
from analysis_data import frame, load_fixture


@pytest.fixture
def fixture_frames():
    """name -> (history frame of main runs, candidate frame, fixture dict); candidate is the last run."""

    def get(name: str):
        fx = load_fixture(name)
        docs = fx["runs"]
        hist = frame(docs[:-1])
        cand = frame(docs[-1:], first_id=len(docs))
        return hist, cand, fx

    return get
