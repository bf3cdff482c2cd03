"""Hardware behind small interfaces: frame sources and power sensors."""
