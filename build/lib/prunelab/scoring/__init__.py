"""Scoring: pure tensor functions that rate weights or layers (higher = more important)."""
