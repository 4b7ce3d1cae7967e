"""Cuvil's version: the one place it is written in Python (pyproject.toml's static ``version`` matches it;
tests/test_layering.py checks that the two agree)."""

from __future__ import annotations

__version__ = "0.1.0"
