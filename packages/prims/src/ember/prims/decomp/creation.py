"""Decompositions: creation (being written)."""

from __future__ import annotations
