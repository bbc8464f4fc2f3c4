"""The kit's own test models, made offline: the tiny built hybrids (Qwen3-Next, NemotronH) and
the trained needle models, with their training data, architectures and trainer."""
