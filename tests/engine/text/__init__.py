"""Tests of engine/text/."""
