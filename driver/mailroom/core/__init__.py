"""Helpers every area shares: one-line errors and their kinds, stderr logging, durations."""
