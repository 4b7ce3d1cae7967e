"""Cuvil's version: the one place it is written (pyproject.toml reads it as its dynamic ``version``;
tests/test_layering.py checks that nothing else writes it)."""

from __future__ import annotations

__version__ = "0.1.0"
