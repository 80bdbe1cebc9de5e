"""Tests of engine/model/."""
