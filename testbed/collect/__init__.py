"""Collectors: rank metrics and kernel counters into tables, plots and reports."""
