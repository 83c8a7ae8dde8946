"""The llama.cpp tree: the pin, the verified sdist it comes from, the fetched sources and their snapshots, and the patch
series on a branch."""
