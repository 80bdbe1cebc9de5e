"""Tests of engine/memory/."""
