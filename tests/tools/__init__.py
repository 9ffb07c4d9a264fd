"""Tests of middlebox/tools/."""
