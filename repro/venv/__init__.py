"""Engine virtualenvs and trees, and the Python-only patches applied to them."""
