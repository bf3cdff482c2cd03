"""The typer CLI: one module per noun, thin commands, rendering in render.py."""
