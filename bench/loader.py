"""Data loading per training epoch, with and without waveform augmentation.

Each config's training set as `asr fit` loads it (speed perturbation, audio cache), read item
by item in this process, plain and with the augmentation of conf/an4/augment_strong.yaml (the
strongest set, so the cost is an upper bound): epochs 0-7 fill the cache (each item at each
speed factor, all but about 4 %) untimed, then epochs 8 and 9 are timed.
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from bench.common import CONFIGS, ROOT, Settings, SpeechDataset, read_config, read_manifest

# Added to a model config with a second --config.
AUGMENT_CONFIG = ROOT / "conf/an4/augment_strong.yaml"

WARM_EPOCHS = range(8)  # an item misses a given speed factor in all of them with p = (2/3)^8
TIMED_EPOCHS = (8, 9)


def epoch_seconds(dataset: SpeechDataset, epoch: int) -> float:
    """Seconds to read every item of `dataset` in `epoch`."""
    dataset.set_epoch(epoch)
    start = time.perf_counter()
    for index in range(len(dataset)):
        dataset[index]
    return time.perf_counter() - start


def measure(name: str, settings: Settings) -> dict[str, Any]:
    """Mean seconds per timed epoch of config `name`'s training set, augmented or not."""
    from asr.data.augment import WaveAugment, WaveAugmenter

    data = read_config(name)["data"]["init_args"]
    augment = yaml.safe_load(AUGMENT_CONFIG.read_text())["data"]["init_args"]["augment"]
    utterances = read_manifest(settings.data / "train.jsonl")[: settings.pick(40, None)]
    result: dict[str, Any] = {"utterances": len(utterances), "augment": augment}
    augmented = WaveAugmenter(WaveAugment.from_dict(augment), 16000)
    for label, augmenter in (("plain", None), ("augmented", augmented)):
        dataset = SpeechDataset(
            utterances, None, 16000, data.get("speed_perturb"), settings.seed,
            cache_audio=data.get("cache_audio", False), augment=augmenter,
        )  # fmt: skip
        for epoch in WARM_EPOCHS:
            epoch_seconds(dataset, epoch)
        timed = [epoch_seconds(dataset, epoch) for epoch in TIMED_EPOCHS]
        result[label] = sum(timed) / len(timed)
    return result


def run(settings: Settings) -> dict[str, Any]:
    return {name: measure(name, settings) for name in CONFIGS}
