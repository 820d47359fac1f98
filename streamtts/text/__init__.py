"""Text handling: normalisation (the official rules) and the streaming segmenter."""
