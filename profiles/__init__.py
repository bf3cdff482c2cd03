"""Built-in device profiles (TOML data), installed as package data of edgedeploy."""
