"""Building blocks shared by mechanisms and models."""
