"""Tests of engine/kv/."""
