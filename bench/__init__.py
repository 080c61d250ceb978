"""Benchmarks of the `asr` package (not part of the tests): `python -m bench all`.

Parts: `peak` (matmul GFLOP/s, the machine limit), `train` (training throughput and MFU of
the AN4 configs, and whole `asr fit` epochs), `decode` (RTF of greedy / beam / beam + CTC by
batch size), `scaling` (DDP, utterance length, batch size), `peer` (against SpeechBrain's
TransformerASR at the same size); `report` turns their JSON into results.md and bench.png.
See bench/README.md.
"""
