"""From an experiment to measured cells: expand (pure), shape the fabric, launch ranks, watch, record."""
