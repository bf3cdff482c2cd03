"""Built-in model cards (TOML data), installed as package data of edgedeploy."""
