"""`asr explore`: an interactive page of a decode, transcription or training run folder."""
