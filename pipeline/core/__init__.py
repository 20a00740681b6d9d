"""The shared foundation every area may import (and which imports none of them):
errors, atomic writes, content hashes, registries, file locks, torchrun's process ranks."""
