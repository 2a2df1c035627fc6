"""Tests of furnace.emulation (Ape emulated types)."""
