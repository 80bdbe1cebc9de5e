"""Tests of engine/generation/."""
