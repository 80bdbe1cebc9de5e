"""Tests of engine/runtime/."""
