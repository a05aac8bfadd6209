"""Other libraries' models running our kernels (each module imports its library lazily)."""
