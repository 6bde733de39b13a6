"""Decompositions: activations (being written)."""

from __future__ import annotations
