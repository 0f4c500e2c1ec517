"""Widgets of the TTTR app; each takes its data as attributes and posts facts upward."""
