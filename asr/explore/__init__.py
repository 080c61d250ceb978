"""`asr explore`: an interactive page of a decode, transcription or training run folder."""

MAX_MEGABYTES = 100.0  # of pictures, maps and embedded audio on a page, by default
