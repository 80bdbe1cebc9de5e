"""Packaging: the PyInstaller spec, the build script and the platform installers."""
