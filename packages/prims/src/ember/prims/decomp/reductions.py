"""Decompositions: reductions (being written)."""

from __future__ import annotations
