"""Screens of the TTTR app; each screen coordinates its widgets."""
