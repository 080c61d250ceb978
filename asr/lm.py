"""Token language models for shallow fusion, trained by `asr fit` (`LMModule`, `TextDataModule`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from asr.checkpoint import LM_KEY, checkpoint_payload, weight_differences
from asr.data.dataset import set_loader_epoch
from asr.data.manifest import read_manifest
from asr.lightning import (
    ExactResume,
    ResumableData,
    bucketed_loader,
    log_mean,
    save_hyperparameters,
    stage_manifests,
    step_schedule,
)
from asr.loading import load_lm
from asr.models.dropout import use_fast_dropout
from asr.models.lm import build_lm
from asr.text import EOS_ID, PAD_ID, SOS_ID, Tokenizer, tokenizer_difference

log = logging.getLogger(__name__)


def _adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-6)


@dataclass
class TextBatch:
    """Padded token sequences for teacher forcing."""

    inputs: Tensor  # (B, L) `[sos] + y`, pad after the end
    targets: Tensor  # (B, L) `y + [eos]`, pad after the end
    lens: Tensor  # (B,) int64 `len(y) + 1`

    def __len__(self) -> int:
        return self.inputs.size(0)


def collate_text(sequences: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> TextBatch:
    """Build LM inputs `[sos] + y` and targets `y + [eos]`, right-padded with `pad_id`.

    >>> batch = collate_text([[7, 8], [9]])
    >>> batch.inputs.tolist(), batch.targets.tolist(), batch.lens.tolist()
    ([[3, 7, 8], [3, 9, 1]], [[7, 8, 3], [9, 3, 1]], [3, 2])
    """
    lens = torch.tensor([len(s) + 1 for s in sequences], dtype=torch.long)
    width = int(lens.max()) if len(sequences) else 0
    inputs = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    targets = torch.full_like(inputs, pad_id)
    for row, seq in enumerate(sequences):
        ids = torch.as_tensor(list(seq), dtype=torch.long)
        inputs[row, : len(seq) + 1] = torch.cat([torch.tensor([SOS_ID]), ids])
        targets[row, : len(seq) + 1] = torch.cat([ids, torch.tensor([EOS_ID])])
    return TextBatch(inputs, targets, lens)


class LMModule(ExactResume):
    """Trains a token LM by cross-entropy over `y + [eos]`; logs `val/loss` and `val/ppl`.

    Args:
        lm: factory called with `vocab_size`, e.g. `asr.models.lm.LSTMLM`.
        vocab_size: linked from the data module's tokenizer.
        tokenizer: tokenizer directory, linked from the data module; embedded in checkpoints.
        optimizer: optimizer factory over the parameters.
        lr_scheduler: optional schedule factory, stepped every optimizer step.
        fast_dropout: train with `asr.models.dropout.FastDropout`.
        init_from: an LM checkpoint (a run's, or `asr average`'s) of this architecture and
            tokenizer to start from: a new run (other settings, more text) from its weights.
    """

    def __init__(
        self,
        lm: Callable[[int], nn.Module],
        vocab_size: int = 0,
        tokenizer: str = "",
        optimizer: OptimizerCallable = _adamw,
        lr_scheduler: LRSchedulerCallable | None = None,
        fast_dropout: bool = False,
        init_from: str | None = None,
    ):
        super().__init__()
        save_hyperparameters(self, ["lm", "optimizer", "lr_scheduler"])
        self.lm = build_lm(lm, vocab_size)
        if fast_dropout:
            use_fast_dropout(self.lm)
        self.tokenizer = Tokenizer.load(tokenizer) if tokenizer else None
        if init_from:
            self._start_from(init_from)
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.model_config: dict | None = None
        self._eval_sums = torch.zeros(2, dtype=torch.float64)  # (nll, tokens)

    def _start_from(self, path: str) -> None:
        if self.tokenizer is None:
            raise ValueError("init_from needs the tokenizer (linked from the data module)")
        trained, tokenizer = load_lm(path)
        difference = tokenizer_difference(tokenizer, self.tokenizer)
        if difference:
            raise ValueError(f"init_from: {path}: trained with another tokenizer than "
                             f"--data.tokenizer's ({difference})")  # fmt: skip
        differ = weight_differences(self.lm.state_dict(), trained.state_dict())
        if differ:
            raise ValueError(f"init_from: {path}: its weights are not this config's LM: "
                             f"{differ[0]}; give the settings it was trained with")  # fmt: skip
        self.lm.load_state_dict(trained.state_dict())
        rank_zero_info(f"init_from: the LM starts from the weights of {path}")

    def forward(self, tokens: Tensor) -> Tensor:
        """Next-token logits `(B, L, V)` of sos-prefixed, right-padded inputs `(B, L)`."""
        return self.lm(tokens)

    def token_nll(self, batch: TextBatch) -> tuple[Tensor, int]:
        """Summed negative log-likelihood of the batch's target tokens, and their count."""
        logits = self.lm(batch.inputs)  # (B, L, V)
        nll = F.cross_entropy(
            logits.flatten(0, 1).float(),
            batch.targets.flatten(),
            ignore_index=PAD_ID,
            reduction="sum",
        )
        return nll, int(batch.lens.sum())

    def training_step(self, batch: TextBatch, batch_idx: int) -> Tensor:
        nll, tokens = self.token_nll(batch)
        loss = nll / tokens
        log_mean(self, "train/loss", loss, tokens, prog_bar=True, per_step=True)
        return loss

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        set_loader_epoch(self.trainer.train_dataloader, self.current_epoch)

    def validation_step(self, batch: TextBatch, batch_idx: int) -> None:
        self._accumulate(batch)

    def test_step(self, batch: TextBatch, batch_idx: int) -> None:
        self._accumulate(batch)

    def on_validation_epoch_start(self) -> None:
        self._eval_sums = torch.zeros(2, dtype=torch.float64, device=self.device)

    on_test_epoch_start = on_validation_epoch_start

    def on_validation_epoch_end(self) -> None:
        self._log_perplexity("val")

    def on_test_epoch_end(self) -> None:
        self._log_perplexity("test")

    def _accumulate(self, batch: TextBatch) -> None:
        nll, tokens = self.token_nll(batch)
        self._eval_sums += torch.stack([nll.detach().double(), nll.new_tensor(tokens).double()])

    def _log_perplexity(self, stage: str) -> None:
        nll, tokens = self.all_gather(self._eval_sums).reshape(-1, 2).sum(0)
        loss = nll / tokens.clamp(min=1)
        self.log(f"{stage}/loss", loss.float(), prog_bar=True, sync_dist=True)
        self.log(f"{stage}/ppl", loss.exp().float(), prog_bar=True, sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.model_config is not None and self.tokenizer is not None:
            checkpoint[LM_KEY] = checkpoint_payload(self.model_config, self.tokenizer)

    def configure_optimizers(self):
        factories = self.optimizer_factory, self.scheduler_factory
        return step_schedule(*factories, self.parameters(), self._trainer)


@dataclass(frozen=True)
class _Sentence:
    where: str
    text: str


class TextDataModule(ResumableData):
    """Transcripts -> length-bucketed batches of token sequences under a token budget.

    Args:
        train_manifest: JSONL manifest whose transcripts are the training text.
        val_manifest: JSONL manifest for validation perplexity.
        tokenizer: directory written by `asr tokenizer` (the recognizer's, for fusion).
        test_manifest: optional JSONL manifest for `asr test`.
        extra_text: more training text: UTF-8 files (or one file) of one sentence per line.
        max_batch_tokens: padded tokens per batch (batch size x longest sequence, eos included).
        max_batch_size: optional cap on sentences per batch.
        num_buckets: length buckets of the sampler.
        num_workers: data loader worker processes.
        seed: shuffling seed.
        skip_bad: skip (and report) bad lines and out-of-vocabulary sentences, not fail.
    """

    def __init__(
        self,
        train_manifest: str,
        val_manifest: str,
        tokenizer: str,
        test_manifest: str | None = None,
        extra_text: list[str] | str | None = None,
        max_batch_tokens: int = 8192,
        max_batch_size: int | None = None,
        num_buckets: int = 10,
        num_workers: int = 0,
        seed: int = 0,
        skip_bad: bool = False,
    ):
        super().__init__()
        if max_batch_tokens < 1 or (max_batch_size is not None and max_batch_size < 1):
            raise ValueError(
                f"max_batch_tokens ({max_batch_tokens}) and max_batch_size ({max_batch_size}) "
                "must be positive"
            )
        save_hyperparameters(self)
        self.tokenizer = Tokenizer.load(tokenizer, option="data.tokenizer")
        self.datasets: dict[str, list[list[int]]] = {}

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def setup(self, stage: str) -> None:
        hp = self.hparams
        for split, manifest in stage_manifests(self, stage):
            sentences = self._manifest_text(manifest)
            if split == "train":
                extra = hp.extra_text or []
                for path in [extra] if isinstance(extra, str) else extra:
                    sentences += _read_text_file(path)
            self.datasets[split] = self._encode(sentences, split)
            if not self.datasets[split]:  # no batches: fit ended at once, saving nothing
                left = " left after skipping bad or empty ones" if sentences or hp.skip_bad else ""
                raise ValueError(f"{manifest}: no {split} sentences{left}: no text to use")
            log.info("%s text: %d sentences", split, len(self.datasets[split]))

    def _manifest_text(self, path: str) -> list[_Sentence]:
        utts = read_manifest(path, skip_bad=self.hparams.skip_bad)
        return [_Sentence(f"{path}:{u.utt_id}", u.text) for u in utts]

    def _encode(self, sentences: list[_Sentence], split: str) -> list[list[int]]:
        checked = [(s, self.tokenizer.oov(s.text)) for s in sentences]
        bad = [(s, chars) for s, chars in checked if chars]
        if bad and not self.hparams.skip_bad:
            lines = "\n".join(f"  {s.where}: {''.join(c)!r}" for s, c in bad[:20])
            raise ValueError(
                f"{len(bad)} sentences have characters outside the tokenizer's vocabulary "
                f"(use data.skip_bad to skip them):\n{lines}"
            )
        if bad:
            log.warning("skipping %d sentences with out-of-vocabulary text", len(bad))
        encoded = [self.tokenizer.encode(s.text) for s, chars in checked if not chars]
        empty = sum(not ids for ids in encoded)
        if empty:  # they would teach the LM to end at once
            log.warning("skipping %d %s sentences with no tokens after normalisation (punctuation "
                        "only, such as '* * *')", empty, split)  # fmt: skip
        return [ids for ids in encoded if ids]

    def _loader(self, split: str, shuffle: bool) -> torch.utils.data.DataLoader:
        sequences = self.datasets[split]
        lengths = [len(s) + 1 for s in sequences]
        collate_fn = partial(collate_text, pad_id=self.tokenizer.pad_id)
        budget = self.hparams.max_batch_tokens
        return bucketed_loader(self, sequences, lengths, budget, collate_fn, shuffle)

    def train_dataloader(self):
        return self._resumed(self._loader("train", shuffle=True))

    def val_dataloader(self):
        return self._loader("val", shuffle=False)

    def test_dataloader(self):
        return self._loader("test", shuffle=False)


def _read_text_file(path: str | os.PathLike) -> list[_Sentence]:
    try:
        # a byte-order mark is no text (decoded as utf-8, so that errors say the file's byte)
        text = Path(path).read_text(encoding="utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot read text file ({err.strerror})") from None
    # lines as editors and `wc -l` count them: a form feed or U+2028 inside one ends no sentence
    lines = enumerate(text.removesuffix("\n").split("\n"), start=1)
    return [_Sentence(f"{path}:{n}", line.removesuffix("\r")) for n, line in lines if line.strip()]
