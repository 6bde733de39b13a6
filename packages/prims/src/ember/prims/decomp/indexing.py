"""Decompositions: indexing (being written)."""

from __future__ import annotations
