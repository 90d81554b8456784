"""Readers for memory logs written by other tools, returned as a `Run` like a miles-profile log."""
