"""Shipped assets: the task suite, styles, fixtures."""
