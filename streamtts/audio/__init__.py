"""Audio in and out: output formats and resampling, reference-voice loading, playback."""
