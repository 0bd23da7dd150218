"""Link calibration: measure what the emulated links really do, against what is configured."""
