"""Decompositions: random (being written)."""

from __future__ import annotations
