"""Model -> compiled library -> bundle. Stages are named and registered per target (pipeline.py)."""
