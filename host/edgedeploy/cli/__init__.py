"""The typer CLI: one module per noun, thin commands, rendering in render.py.

Every command is defined when `edgedeploy` starts, so a module here imports at its top only what the command
line needs (typer, options, render, errors, the inventory and profiles); a command imports what does its work
(api, pull_api, field_api, compile/, remote/) when it runs. `edgedeploy --help` thus starts without ONNX, TVM,
NumPy or an SSH library (tests/host/test_startup.py; bench/startup.py times it)."""
