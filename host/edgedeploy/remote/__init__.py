"""Talking to devices: one transport protocol (ssh or local), agent calls, plans and their execution."""
