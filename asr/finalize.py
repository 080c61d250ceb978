"""`asr finalize`: store in a checkpoint the defaults chosen on a dev set (search settings,
confidence scaling, alignment maps)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any

from asr.checkpoint import store_in_payload
from asr.confidence import UnfittableWords
from asr.evaluate import ConfidenceFit, fit_confidence
from asr.heads import HeadChoice, choose_heads, reference_alignments
from asr.recognizer import Recognizer
from asr.search import LanguageModel, SearchOptions


@dataclass
class Finished:
    """What `finalize` found; `skipped` says why a part was left out."""

    decoding: dict[str, Any]  # `SearchOptions` fields, as stored
    confidence: ConfidenceFit | None
    heads: HeadChoice | None
    skipped: dict[str, str]  # part -> reason
    failures: list[str]  # manifest lines and audio left out

    def payload(self) -> dict[str, Any]:
        """The checkpoint payload entries to store; None clears an entry."""
        confidence = self.confidence
        return {
            "decoding": self.decoding,
            "confidence_scaling": None if confidence is None else confidence.scaling.as_dict(),
            "alignment_heads": None if self.heads is None else self.heads.chosen,
        }


def stored_decoding(options: SearchOptions) -> dict[str, Any]:
    """The search settings a checkpoint keeps: all but `nbest` and `lm_weight`, set per call."""
    return {k: v for k, v in asdict(options).items() if k not in ("nbest", "lm_weight")}


def finalize(
    recognizer: Recognizer,
    manifest: str | os.PathLike,
    options: SearchOptions,
    lm: LanguageModel | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> Finished:
    """Decoding settings, confidence scaling and alignment maps of `recognizer` on `manifest`."""
    recognizer.check_options(options, lm)
    recognizer = replace(
        recognizer, decoding=options, confidence_scaling=None, alignment_heads=None
    )
    skipped, failures = {}, []
    try:
        confidence = fit_confidence(
            recognizer, manifest, options, lm, batch_size, progress, failures
        )
    except UnfittableWords as err:
        confidence, skipped["confidence"] = None, str(err)
    heads = None
    if recognizer.model.ctc is None:
        skipped["alignment maps"] = "no CTC head to compare attention times with"
    elif recognizer.model.decoder.num_attention_maps < 2:
        skipped["alignment maps"] = "one attention map: nothing to choose"
    else:
        try:
            alignments = reference_alignments(recognizer, manifest, progress, failures)
            heads = choose_heads(recognizer, alignments)
        except ValueError as err:  # no reference that CTC can align
            skipped["alignment maps"] = str(err)
    # each part lists the same bad lines and audio: once
    return Finished(
        stored_decoding(options), confidence, heads, skipped, [*dict.fromkeys(failures)]
    )


def store(checkpoint: str | os.PathLike, finished: Finished) -> None:
    """Write what `finalize` found into `checkpoint`, in one atomic rewrite."""
    store_in_payload(checkpoint, finished.payload())
