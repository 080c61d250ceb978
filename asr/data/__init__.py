"""Data: JSON Lines manifests, corpus preparation, datasets, batch sampling and collation."""
