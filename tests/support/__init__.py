"""Helpers shared by meshrun's tests (readers for files the code under test writes)."""
