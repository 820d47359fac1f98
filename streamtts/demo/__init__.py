"""The synthetic demo model: tiny random weights in the exact official layout (real ids and file contracts)."""
