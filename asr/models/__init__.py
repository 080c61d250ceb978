"""Encoders, attention, decoders and the Seq2Seq recognizer that composes them."""
