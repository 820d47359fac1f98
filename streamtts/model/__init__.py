"""Model files: converting the original MOSS-TTS-Delay checkpoint into the published bundle."""
