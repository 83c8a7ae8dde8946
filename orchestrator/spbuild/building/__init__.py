"""Building the patched tree: CMake and its toolchains, the build itself, the machine check and the installs."""
