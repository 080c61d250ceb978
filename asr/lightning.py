"""Lightning wrappers: `ASRModule` trains a `Seq2Seq`; `ASRDataModule` batches manifests."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from asr.checkpoint import RECOGNIZER_KEY, checkpoint_payload
from asr.data.augment import WaveAugment, WaveAugmenter
from asr.data.dataset import Batch, SpeechDataset, collate, round_up, set_loader_epoch
from asr.data.manifest import MIN_DURATION, format_bad_entries, validate_manifest
from asr.data.sampler import DynamicBucketSampler, LengthGrid
from asr.data.shards import (
    DEFAULT_SHUFFLE_BUFFER,
    ShardedSpeechDataset,
    StreamOptions,
    check_vocabulary,
    is_shard_folder,
    read_index,
    stream_loader,
)
from asr.finetune import Transfer
from asr.finetune import init_from as init_model_from
from asr.metrics import ErrorCounts, char_errors, word_errors
from asr.models.blocks import InputTooShort
from asr.models.ctc import InterCTC
from asr.models.dropout import use_fast_dropout
from asr.models.seq2seq import LossOutput, Seq2Seq, build_seq2seq
from asr.precision import BF16_STEP_ROWS
from asr.search import Hypothesis, fastest_speech, greedy_search, length_bound
from asr.segment import segment_seconds_for
from asr.text import Tokenizer
from asr.timing import ctc_frames_needed

log = logging.getLogger(__name__)


class NonFiniteStreak(FloatingPointError):
    """Training stopped: `max_nonfinite_steps` steps in a row had a non-finite loss or
    gradient (its message says what to do)."""


TOKEN_MULTIPLE = 16


def _adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-6, fused=True)


class ExactResume(L.LightningModule):
    """A module whose resumed run goes on as if never stopped. Each rank's random state is in
    the checkpoint, so dropout and augmentation draw what they would have. A ReduceLROnPlateau:
    Lightning steps it after an epoch's checkpoints are written, so a run resumed from one
    skipped that step: the checkpoint keeps the val/loss it is owed, stepped on when training
    starts again. And Lightning leaves out the step of an epoch resumed mid-way (its metrics
    are not saved), though the epoch ends with a validation of its own: that step is taken
    here. Nor does it save an epoch's running means (`log_mean`'s): the sums of the batches
    trained before the stop are kept and logged again, so the resumed epoch's means are over
    all its batches. Nor the gradients of a stop inside an accumulation window (`max_time`):
    they are kept, and the window's other batches add to them. (The batches are the data
    module's: `ResumableData`.)"""

    OWED_KEY = "asr_plateau_owed"
    SUMS_KEY = "asr_epoch_sums"
    GRADS_KEY = "asr_accumulated_grads"

    def __init__(self) -> None:
        super().__init__()
        self._plateau_epoch = -1  # the epoch a ReduceLROnPlateau last stepped after
        self._plateau_owed: float | None = None
        self._validated_step = -1  # the step of the last validation (its val/loss is the latest)
        self._resume_rng: dict | None = None
        # this rank's sum of each epoch mean's values times their batch sizes, and of the sizes
        self._epoch_sums: dict[str, tuple[Tensor | float, float]] = {}
        self._saved_sums: dict[str, tuple[float, float]] = {}  # a checkpoint's, all ranks'
        self._unlogged_sums: dict[str, tuple[float, float]] = {}  # to log once in this epoch
        self._resume_grads: dict[str, Tensor] | None = None  # of a window a stop cut

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.trainer.state.fn == "fit":
            owed = self._owed_plateau_step()
            if owed is not None:
                checkpoint[self.OWED_KEY] = owed
            checkpoint["rng"] = {"torch": torch.get_rng_state()}
            sums = {name: (float(t), n) for name, (t, n) in self._epoch_sums.items()}
            if self.trainer.world_size > 1:  # every rank saves; rank 0 writes all ranks' states
                state = torch.get_rng_state()
                states = [torch.empty_like(state) for _ in range(self.trainer.world_size)]
                torch.distributed.all_gather(states, state)
                checkpoint["rng"]["ranks"] = states
                ranks: list[dict] = [{} for _ in range(self.trainer.world_size)]
                torch.distributed.all_gather_object(ranks, sums)
                sums = {
                    name: (sum(r[name][0] for r in ranks if name in r),
                           sum(r[name][1] for r in ranks if name in r))
                    for name in {name for r in ranks for name in r}
                }  # fmt: skip
            checkpoint[self.SUMS_KEY] = sums
            grads = self._accumulated_grads()
            if grads is not None:
                checkpoint[self.GRADS_KEY] = grads

    def _accumulated_grads(self) -> dict[str, Tensor] | None:
        """The gradients summed since the last optimizer step, where the save falls inside an
        accumulation window; under DDP their mean over ranks, which the step's all-reduce
        averages alike whichever rank holds which share."""
        trainer = self.trainer
        if (
            trainer.accumulate_grad_batches == 1
            or not trainer.fit_loop.epoch_loop._should_accumulate()
        ):
            return None
        grads = {
            n: p.grad.detach().clone() for n, p in self.named_parameters() if p.grad is not None
        }
        if trainer.world_size > 1:
            for grad in grads.values():
                torch.distributed.all_reduce(grad)
                grad /= trainer.world_size
        return {n: g.cpu() for n, g in grads.items()} or None

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._plateau_owed = checkpoint.get(self.OWED_KEY)
        self._resume_rng = checkpoint.get("rng")
        self._saved_sums = checkpoint.get(self.SUMS_KEY) or {}
        self._resume_grads = checkpoint.get(self.GRADS_KEY)

    def forget_saved_epoch(self) -> None:
        """The resumed epoch starts again from its first batch: the saved sums are not its."""
        self._saved_sums = {}
        self._resume_grads = None

    def count_epoch_mean(self, name: str, value: Tensor, batch_size: float, common: dict) -> None:
        """Add a batch's `value` of the epoch mean `name` to the sums a checkpoint keeps; in an
        epoch resumed mid-way, first log the saved sums as a batch of their own."""
        total, size = self._epoch_sums.get(name, (0.0, 0.0))
        # float32 on the device, as Lightning sums its epoch means
        self._epoch_sums[name] = (total + value.detach().float() * batch_size, size + batch_size)
        self._log_unlogged(name, common)

    def _log_unlogged(self, name: str, common: dict) -> None:
        saved = self._unlogged_sums.pop(name, None)
        if saved is not None:  # on every rank, whose epoch means are synced by name
            total, size = saved
            self.log(
                name, total / size if size else 0.0, on_step=False, on_epoch=True,
                sync_dist=True, **(common | {"batch_size": float(size)}),
            )  # fmt: skip

    def on_train_start(self) -> None:
        loop = self.trainer.fit_loop
        if loop.restarted_mid_epoch or loop.restarted_on_epoch_end:  # the saved epoch goes on
            # rank 0 holds all ranks' sums (the epoch means add them up over ranks), the
            # others none; every rank logs each name
            first = self.global_rank == 0
            self._unlogged_sums = {
                k: v if first else (0.0, 0.0) for k, v in self._saved_sums.items()
            }
            self._epoch_sums = dict(self._saved_sums) if first else {}
        self._saved_sums = {}
        if self._resume_grads is not None and loop.restarted_mid_epoch:
            for name, param in self.named_parameters():
                if name in self._resume_grads:
                    param.grad = self._resume_grads[name].to(param.device, param.dtype)
        self._resume_grads = None
        if self._plateau_owed is not None:  # the saved epoch's, not this one's
            self._step_plateau(self._plateau_owed)
            self._plateau_owed = None

    def on_train_epoch_start(self) -> None:
        self._epoch_sums, self._unlogged_sums = {}, {}

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._resume_rng is not None:  # where the saved run stopped drawing
            ranks = self._resume_rng.get("ranks")
            same_world = ranks is not None and len(ranks) == self.trainer.world_size
            torch.set_rng_state(
                ranks[self.global_rank] if same_world else self._resume_rng["torch"]
            )
            self._resume_rng = None

    def on_validation_start(self) -> None:
        if not self.trainer.sanity_checking:
            self._validated_step = self.trainer.global_step

    def on_train_epoch_end(self) -> None:
        for name in list(self._unlogged_sums):  # resumed at the epoch's end: no batch logged them
            self._log_unlogged(name, {"prog_bar": False})
        if self.trainer.fit_loop.restarting:  # Lightning then does not step it: we do
            owed = self._owed_plateau_step()
            if owed is not None:
                self._step_plateau(owed)
                self._plateau_epoch = self.current_epoch

    def _step_plateau(self, value: float) -> None:
        for config in self.trainer.lr_scheduler_configs:
            if config.reduce_on_plateau:
                config.scheduler.step(value)

    def lr_scheduler_step(self, scheduler, metric) -> None:
        super().lr_scheduler_step(scheduler, metric)
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self._plateau_epoch = self.current_epoch

    def _owed_plateau_step(self) -> float | None:
        """The val/loss a ReduceLROnPlateau will step on at this epoch's end, when a checkpoint
        written now comes before that step (as Lightning orders them): None where none is due."""
        trainer = self.trainer
        if self._plateau_epoch == self.current_epoch:
            return None
        if not trainer.fit_loop.epoch_loop._num_ready_batches_reached():  # mid-epoch
            return None
        if self._validated_step != trainer.global_step:  # not yet validated: its val/loss is old
            return None
        for config in trainer.lr_scheduler_configs:
            due = config.interval == "epoch" and (self.current_epoch + 1) % config.frequency == 0
            value = trainer.callback_metrics.get(config.monitor or "")
            if config.reduce_on_plateau and due and value is not None:
                return float(value)
        return None


class ASRModule(ExactResume):
    """Trains a `Seq2Seq` with joint CTC/attention loss; validates with greedy WER/CER.

    Args:
        frontend: waveform -> features module (e.g. `asr.frontends.Frontend`).
        encoder: factory called with the frontend's `output_dim`.
        decoder: factory called with `(vocab_size, encoder.output_dim)`.
        vocab_size: linked from the data module's tokenizer.
        tokenizer: tokenizer directory, linked from the data module; used to score WER.
        ctc_weight: weight of the CTC loss, below 1 (0 disables the CTC head).
        label_smoothing: label smoothing of the attention cross-entropy.
        optimizer: optimizer factory over the parameters.
        lr_scheduler: optional schedule factory, stepped every optimizer step.
        max_len_ratio: validation's tokens per encoder frame (raised for the fastest speech).
        plot_utterances: cross-attention plots of this many fixed validation utterances.
        plot_every_n_epochs: plot after every n-th epoch.
        max_nonfinite_steps: stop after this many consecutive non-finite (skipped) steps.
        fast_dropout: train with `asr.models.dropout.FastDropout` (cheaper CPU masks).
        init_from: trained recognizer (checkpoint, package or hf://owner/name) to start from.
        freeze_encoder_steps: frontend and encoder stay frozen for this many optimizer steps.
        inter_ctc_layers: encoder blocks (1-based) the CTC head also reads in training.
        inter_ctc_weight: share of those blocks' losses in the CTC loss (0: off).
        greedy_validation: decode the dev set for `val/wer`; false logs losses and `val/acc`.
    """

    def __init__(
        self,
        frontend: nn.Module,
        encoder: Callable[[int], nn.Module],
        decoder: Callable[[int, int], nn.Module],
        vocab_size: int = 0,
        tokenizer: str = "",
        ctc_weight: float = 0.3,
        label_smoothing: float = 0.1,
        optimizer: OptimizerCallable = _adamw,
        lr_scheduler: LRSchedulerCallable | None = None,
        max_len_ratio: float = 1.0,
        plot_utterances: int = 3,
        plot_every_n_epochs: int = 1,
        max_nonfinite_steps: int = 10,
        fast_dropout: bool = False,
        init_from: str | None = None,
        freeze_encoder_steps: int = 0,
        inter_ctc_layers: list[int] | None = None,
        inter_ctc_weight: float = 0.0,
        greedy_validation: bool = True,
    ):
        super().__init__()
        if freeze_encoder_steps < 0:
            raise ValueError(f"freeze_encoder_steps must be >= 0, got {freeze_encoder_steps}")
        if plot_every_n_epochs < 1:
            raise ValueError(f"plot_every_n_epochs must be >= 1, got {plot_every_n_epochs}")
        if not 0 <= ctc_weight < 1:  # above 1 the attention loss is maximised
            raise ValueError(
                f"ctc_weight must lie in [0, 1), got {ctc_weight}"
                + (
                    ": at 1 the attention decoder, which validation and decoding read, would "
                    "never learn (0.3 trains both; `--ctc-weight 1` decodes with CTC alone)"
                    if ctc_weight == 1
                    else ""
                )
            )
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
        save_hyperparameters(self, ["frontend", "encoder", "decoder", "optimizer", "lr_scheduler"])
        self.model = build_seq2seq(frontend, encoder, decoder, vocab_size, ctc_weight)
        self._inter_ctc = _inter_ctc(self.model, inter_ctc_layers, inter_ctc_weight)
        if fast_dropout:
            use_fast_dropout(self.model)
        self.tokenizer = Tokenizer.load(tokenizer) if tokenizer else None
        self.transfer: Transfer | None = None  # what init_from copied
        if init_from:
            if self.tokenizer is None:
                raise ValueError("init_from needs the tokenizer (linked from the data module)")
            # what it copied is said by asr fit, once the settings are known to fit
            self.transfer = init_model_from(self.model, init_from, self.tokenizer)
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.model_config: dict | None = None
        self._val_words = ErrorCounts()
        self._val_chars = ErrorCounts()
        self._skipped_steps = 0
        self._nonfinite_streak = 0
        self._grad_norm: Tensor | None = None
        self._repeats: set[int] = set()  # this evaluation's batches that repeat an utterance
        self._tokens_per_second: float | None = None
        self._saved_tokens_per_second: float | None = None  # --ckpt_path's, without train data
        self._encoder_timing: tuple[float, float] | None = None

    def forward(self, waves: Tensor, wave_lens: Tensor) -> list[list[int]]:
        """Greedy transcription of a padded batch: token ids per utterance."""
        enc, enc_lens = self.model.encode(waves, wave_lens)
        hyps = greedy_search(self.model.decoder, enc, enc_lens, *self._length_bound())
        return [h.tokens for h in hyps]

    def batch_loss(self, batch: Batch) -> LossOutput:
        """The training loss of `batch`: joint CTC/attention at this module's weights."""
        return self.model.loss(
            batch.waves,
            batch.wave_lens,
            batch.tokens,
            batch.token_lens,
            self.hparams.ctc_weight,
            self.hparams.label_smoothing,
            self._inter_ctc,
        )

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        with _naming_the_shortest(batch, self.model.sample_rate):
            out = self.batch_loss(batch)
        if torch.isfinite(out.loss):
            self._log_losses("train", out, len(batch))
        else:  # the step's own value, not the epoch's mean (Lightning would repeat the last)
            size = float(len(batch))  # as log_mean gives it: one key, the same arguments
            self.log("train/loss_step", out.loss.detach(), prog_bar=True, batch_size=size)
            log.warning("non-finite training loss on batch %s", ", ".join(batch.ids[:5]))
        # Backward still runs so that every DDP rank sees non-finite gradients and skips.
        return out.loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._grad_norm = None
        if self.global_step < self.hparams.freeze_encoder_steps:
            # Gradients dropped, not switched off: DDP needs the same parameters every step.
            for p in (*self.model.frontend.parameters(), *self.model.encoder.parameters()):
                p.grad = None
        if _uses_grad_scaler(self.trainer):
            return
        grads = [p.grad for p in _parameters(optimizer) if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else None
        if norm is None or torch.isfinite(norm):
            self._grad_norm = norm
            self._nonfinite_streak = 0
            return
        for p in self.parameters():
            p.grad = None
        self._skipped_steps += 1
        self._nonfinite_streak += 1
        self.log("train/skipped_steps", float(self._skipped_steps), on_step=True, on_epoch=False)
        limit = self.hparams.max_nonfinite_steps
        log.warning(
            "step %d: non-finite loss or gradient, update skipped (%d in a row, limit %d)",
            self.global_step, self._nonfinite_streak, limit,
        )  # fmt: skip
        if self._nonfinite_streak >= limit:
            raise NonFiniteStreak(
                f"stopping: {self._nonfinite_streak} consecutive training steps had a non-finite "
                f"loss or gradient (model.max_nonfinite_steps={limit}); lower the learning rate, "
                "check the data (asr validate-data) or train in fp32 (--trainer.precision 32)"
            )

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip as Lightning does, also for fused optimizers, which Lightning refuses in bf16."""
        if not gradient_clip_val or _uses_grad_scaler(self.trainer):
            lightning_clip = super().configure_gradient_clipping
            lightning_clip(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        params, norm, self._grad_norm = _parameters(optimizer), self._grad_norm, None
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        elif norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params, gradient_clip_val, norm)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        # Reshuffle buckets and redraw speed factors: Lightning does not reach a batch sampler.
        set_loader_epoch(self.trainer.train_dataloader, self.current_epoch)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        with _naming_the_shortest(batch, self.model.sample_rate):
            encoded = self.model.encode_tapped(batch.waves, batch.wave_lens, self._inter_ctc)
        enc, enc_lens, intermediate = encoded
        out = self.model.loss_from_encoder(
            enc, enc_lens, batch.tokens, batch.token_lens, self.hparams.ctc_weight, 0.0,
            intermediate, self._inter_ctc,
        )  # fmt: skip
        repeat = batch_idx in self._repeats  # an utterance counted already: weighs nothing
        self._log_losses(self._eval_stage, out, 0 if repeat else len(batch))
        if self.hparams.greedy_validation and not repeat:
            hyps = self._greedy(enc, enc_lens)
            texts = [self.tokenizer.decode(h.tokens) for h in hyps]
            refs = [self.tokenizer.normalizer(t) for t in batch.texts]
            self._val_words += word_errors(refs, texts)
            self._val_chars += char_errors(refs, texts)
        else:
            hyps = _references(batch, out.attention, enc_lens)
        if not repeat and self._plotted < self.hparams.plot_utterances:
            self._plot(batch, hyps)

    def _greedy(self, enc: Tensor, enc_lens: Tensor) -> list[Hypothesis]:
        """Validation's greedy search, in fp32 for batches too small to gain from bf16."""
        device = enc.device.type
        bound = self._length_bound()
        if not torch.is_autocast_enabled(device) or len(enc) >= BF16_STEP_ROWS:
            return greedy_search(self.model.decoder, enc, enc_lens, *bound)
        with torch.autocast(device, enabled=False):
            return greedy_search(self.model.decoder, enc.float(), enc_lens, *bound)

    def _length_bound(self) -> tuple[float, int]:
        rate = self._fastest_speech()
        if rate is None:
            return self.hparams.max_len_ratio, 0
        return length_bound(self.hparams.max_len_ratio, 0, rate, *self._timing())

    def _timing(self) -> tuple[float, float]:
        """The encoder's `frame_timing`, measured once."""
        if self._encoder_timing is None:
            self._encoder_timing = self.model.encoder_timing()
        return self._encoder_timing

    def on_fit_start(self) -> None:
        self._check_long_enough()
        self._fastest_speech()  # warns of transcripts too long for their audio up front

    def _check_long_enough(self) -> None:
        """ValueError naming the training or dev utterances too short for the encoder (at the
        fastest speed perturbation): the first batch to hold one would stop the run, epochs in
        and without its name."""
        datasets = getattr(getattr(self._trainer, "datamodule", None), "datasets", {})
        need = self.model.shortest_input() / self.model.sample_rate
        for split in ("train", "val"):
            dataset = datasets.get(split)
            if dataset is None or not len(dataset):
                continue
            fastest = max(dataset.speed_perturb or [1.0]) if split == "train" else 1.0
            durations = [float(d) for d in dataset.durations]
            short = [k for k, seconds in enumerate(durations) if seconds / fastest < need]
            if not short:
                continue
            floor = math.ceil(need * fastest * 100) / 100
            if isinstance(dataset, SpeechDataset):  # a stream's utterances are not at hand
                utterances = dataset.utterances
                named = ", ".join(
                    f"{utterances[k].utt_id} ({durations[k]:.3f} s)" for k in short[:5]
                )
                named += ", ..." if len(short) > 5 else ""
                remedy = (
                    f"leave them out with data.min_duration {floor:g} and data.skip_bad true, "
                    "or drop them from the manifest"
                )
            else:
                named = f"the shortest {min(durations):.3f} s"
                remedy = f"shard a manifest without those under {floor:g} s"
            at = f" ({need * fastest:.3f} s before speed perturbation by {fastest:g})"
            raise ValueError(
                f"{len(short)} {'training' if split == 'train' else 'dev'} utterance(s) too short "
                f"for the encoder, which needs {need:.3f} s of audio{at if fastest > 1 else ''}: "
                f"{named}; {remedy}"
            )

    def _fastest_speech(self) -> float | None:
        """Tokens per second of the fastest training speech, of the texts CTC can align (as the
        checkpoint validated or tested stored it, where no training data is at hand)."""
        if self._tokens_per_second is None:
            train = self._train_dataset()
            if train is None:
                return self._saved_tokens_per_second
            utterances = train.utterances
            ids = [self.tokenizer.encode(u.text) for u in utterances]
            kept = self._alignable(utterances, ids)
            counts = [len(ids[k]) for k in kept]
            durations = [utterances[k].duration for k in kept]
            speed = max(train.speed_perturb, default=1.0)
            self._tokens_per_second = fastest_speech(counts, durations, speed)
        return self._tokens_per_second

    def _alignable(self, utterances: Sequence, ids: list[list[int]]) -> list[int]:
        """Indices of the utterances whose targets fit their encoder frames; warns of the rest,
        whose CTC loss is zero (a transcript of another recording, or a wrong duration). Of
        shards, the index's fastest-spoken alone are at hand. Without CTC, frames do not bound
        a target (a pyramidal encoder's may be fewer than its characters): all are kept."""
        if not self.hparams.ctc_weight:
            return list(range(len(utterances)))
        frame_seconds, edge_seconds = self._timing()
        frames = [(u.duration - edge_seconds) / frame_seconds for u in utterances]
        needed = [ctc_frames_needed(t) for t in ids]
        for k, u in enumerate(utterances):  # the line through 1 s is a frame off at most
            if abs(frames[k] - needed[k]) <= 1:
                frames[k] = self.model.encoder_frames(round(u.duration * self.model.sample_rate))
        kept = [k for k in range(len(utterances)) if needed[k] <= frames[k]]
        bad = [k for k in range(len(utterances)) if needed[k] > frames[k]]
        if bad and self.global_rank == 0:
            rate = self.model.sample_rate  # those named, measured: the line is off by deep pyramids
            named = ", ".join(
                f"{utterances[k].utt_id} ({needed[k]} CTC frames, audio gives "
                f"{self.model.encoder_frames(round(utterances[k].duration * rate))})"
                for k in bad[:5]
            )
            check = "Check their text and duration"
            # Every one of the corpus (of shards, the fastest alone are at hand) fitting the
            # features but none the encoder's frames: those are too few, not the data wrong.
            if not kept and not isinstance(self._train_dataset(), ShardedSpeechDataset):
                hop = self.model.feature_seconds()  # measured: only where it is asked
                if all(n * hop <= u.duration for n, u in zip(needed, utterances)):
                    check = (f"None fits: the encoder gives a frame per "
                             f"{1000 * frame_seconds:.0f} ms, too few for these transcripts; "
                             "subsample less")  # fmt: skip
            log.warning(
                "%d training transcript(s) too long for their audio: CTC cannot align them "
                "and their CTC loss is zero: %s%s. %s",
                len(bad), named, ", ..." if len(bad) > 5 else "", check,
            )  # fmt: skip
        return kept

    def _train_dataset(self) -> SpeechDataset | ShardedSpeechDataset | None:
        trainer = self._trainer
        train = getattr(getattr(trainer, "datamodule", None), "datasets", {}).get("train")
        return train if train is not None and len(train) else None

    @property
    def _eval_stage(self) -> str:
        return "test" if self.trainer.testing else "val"

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def on_test_epoch_start(self) -> None:
        self.on_validation_epoch_start()

    def on_test_epoch_end(self) -> None:
        self.on_validation_epoch_end()

    def on_validation_epoch_start(self) -> None:
        self._val_words, self._val_chars = ErrorCounts(), ErrorCounts()
        self._plotted = 0  # the first batches' utterances: the same each epoch
        trainer = self.trainer
        loaders = trainer.test_dataloaders if trainer.testing else trainer.val_dataloaders
        sampler = getattr(loaders, "batch_sampler", None)
        self._repeats = sampler.repeats() if isinstance(sampler, DynamicBucketSampler) else set()

    def on_validation_epoch_end(self) -> None:
        if not self.hparams.greedy_validation:
            return
        counts = torch.tensor(
            [
                self._val_words.errors,
                self._val_words.reference_length,
                self._val_chars.errors,
                self._val_chars.reference_length,
            ],
            dtype=torch.float64,
            device=self.device,
        )
        counts = self.all_gather(counts).reshape(-1, 4).sum(0)
        wer = 100 * counts[0] / counts[1].clamp(min=1)
        cer = 100 * counts[2] / counts[3].clamp(min=1)
        self.log(f"{self._eval_stage}/wer", wer.float(), prog_bar=True, sync_dist=True)
        self.log(f"{self._eval_stage}/cer", cer.float(), prog_bar=True, sync_dist=True)

    def _log_losses(self, stage: str, out, batch_size: int) -> None:
        values = {
            "loss": out.loss,
            "att_loss": out.attention_loss,
            "acc": out.token_accuracy,
            "ctc_loss": out.ctc_loss,
            "inter_ctc_loss": out.inter_ctc_loss,
        }
        for name, value in values.items():
            if value is not None:
                train, bar = stage == "train", name == "loss"
                log_mean(self, f"{stage}/{name}", value, batch_size, prog_bar=bar, per_step=train)

    def _plot(self, batch: Batch, hyps) -> None:
        n = min(self.hparams.plot_utterances - self._plotted, len(hyps))
        self._plotted += n
        # a fast_dev_run writes no files, Lightning's banner says: no plots either
        if self.trainer.sanity_checking or self.trainer.fast_dev_run:
            return
        if not self.trainer.is_global_zero:
            return
        if (self.current_epoch + 1) % self.hparams.plot_every_n_epochs:
            return
        # Not trainer.log_dir: it broadcasts, and only rank zero gets here.
        run_dir = self.loggers[0].log_dir if self.loggers else None
        log_dir = Path(run_dir or self.trainer.default_root_dir) / "attention"
        log_dir.mkdir(parents=True, exist_ok=True)
        feats, feat_lens = self.model.frontend(batch.waves[:n], batch.wave_lens[:n])
        hop = self.model.feature_seconds()  # 20 ms at 8 kHz with a 160-sample hop, not 10
        from asr.plotting import plot_attention, save_figure

        for i in range(n):
            labels = self.tokenizer.pieces(hyps[i].tokens) + ["<eos>"]
            fig = plot_attention(
                hyps[i].attention,
                labels,
                feats[i, : feat_lens[i]],
                frame_shift=hop,
                title=f"{batch.ids[i]} epoch {self.current_epoch}",
            )
            for logger in self.loggers:
                if hasattr(logger.experiment, "add_figure"):
                    logger.experiment.add_figure(
                        f"attention/{batch.ids[i]}", fig, self.global_step, close=False
                    )
            save_figure(fig, str(log_dir / f"epoch{self.current_epoch:03d}_{batch.ids[i]}.png"))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.model_config is not None and self.tokenizer is not None:
            checkpoint[RECOGNIZER_KEY] = checkpoint_payload(
                self.model_config,
                self.tokenizer,
                segment_seconds=self._segment_seconds(),
                tokens_per_second=self._fastest_speech(),
            )

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        payload = checkpoint.get(RECOGNIZER_KEY)
        if isinstance(payload, dict):  # the length bound greedy validation decoded with
            self._saved_tokens_per_second = payload.get("tokens_per_second")

    def _segment_seconds(self) -> float | None:
        train = self._train_dataset()
        return None if train is None else segment_seconds_for(train.durations)

    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        if self.global_step <= self.hparams.freeze_encoder_steps:  # frozen, or thawed now
            # A frozen encoder's batch statistics (the Conformer's BatchNorm) stay as trained;
            # set every batch: Lightning turns the whole model to training at each epoch.
            frozen = self.global_step < self.hparams.freeze_encoder_steps
            for part in (*self.model.frontend.modules(), *self.model.encoder.modules()):
                if getattr(part, "track_running_stats", False):
                    part.train(not frozen)
        super().on_train_batch_start(batch, batch_idx)  # dropout, SpecAugment: as if unstopped

    def configure_optimizers(self):
        factories = self.optimizer_factory, self.scheduler_factory
        return step_schedule(*factories, self.parameters(), self._trainer)


def step_schedule(
    optimizer_factory: OptimizerCallable,
    scheduler_factory: LRSchedulerCallable | None,
    parameters,
    trainer: L.Trainer | None = None,
):
    """`configure_optimizers` output: the optimizer, and its schedule stepped every step, or
    a ReduceLROnPlateau stepped on `val/loss` after each epoch that validates (every
    `trainer.check_val_every_n_epoch`-th; where none does, Lightning warns)."""
    try:
        optimizer = optimizer_factory(parameters)
    except ValueError as err:  # torch's "Invalid learning rate": said as the setting it is
        raise ValueError(f"model.init_args.optimizer: {err}") from None
    if scheduler_factory is None:
        return optimizer
    scheduler = scheduler_factory(optimizer)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        # Stepped only after validations: between them the logged val/loss is stale.
        every = getattr(trainer, "check_val_every_n_epoch", 1)
        if every is None:
            raise ValueError(
                "ReduceLROnPlateau steps after the epochs that validate, and "
                "trainer.check_val_every_n_epoch null validates by steps: give it a number"
            )
        plateau = {"scheduler": scheduler, "interval": "epoch", "monitor": "val/loss"}
        plateau |= {"frequency": every, "strict": False}
        return {"optimizer": optimizer, "lr_scheduler": plateau}
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _inter_ctc(model: Seq2Seq, layers: list[int] | None, weight: float) -> InterCTC | None:
    if not weight:
        return None
    if model.ctc is None:
        raise ValueError(f"inter_ctc_weight={weight} needs the CTC head (ctc_weight > 0)")
    inter = InterCTC(tuple(layers or ()), weight)
    inter.blocks(model.encoder)
    return inter


def _parameters(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def log_mean(
    module: L.LightningModule,
    name: str,
    value: Tensor,
    batch_size: int,
    prog_bar: bool = False,
    per_step: bool = False,
) -> None:
    """Log `name`: `value`'s mean over the epoch's batches on every rank, weighted by their
    sizes. With `per_step`, as `name`_epoch, beside `name`_step: each step's value on its own
    rank (no collective each step)."""
    # A float size: Lightning mean-reduces the sizes' sum over ranks, which floors an integer
    # one and inflates the mean (Lightning-AI/pytorch-lightning#21859).
    common = {"prog_bar": prog_bar, "batch_size": float(batch_size)}
    if per_step:
        module.log(f"{name}_step", value, on_step=True, on_epoch=False, **common)
        name = f"{name}_epoch"
        if isinstance(module, ExactResume):
            module.count_epoch_mean(name, value, batch_size, common)
    module.log(name, value, on_step=False, on_epoch=True, sync_dist=True, **common)


def save_hyperparameters(
    module: L.LightningModule | L.LightningDataModule, ignore: Sequence[str] = ()
) -> None:
    """`module.save_hyperparameters` of its caller's arguments, given the caller's frame. Left to
    find it, Lightning keeps it in a frame that refers to itself: the callers' locals (their
    DataLoaders too, whose persistent workers then take 5 s each to stop) wait for the cyclic
    garbage collector."""
    module.save_hyperparameters(ignore=list(ignore), frame=inspect.currentframe().f_back)


@contextlib.contextmanager
def _naming_the_shortest(batch: Batch, sample_rate: int) -> Iterator[None]:
    """InputTooShort naming the batch's shortest utterance: checked before training by its
    manifest duration, which may overstate its audio (by less than the manifest check allows)."""
    try:
        yield
    except InputTooShort as err:
        k = int(batch.wave_lens.argmin())
        seconds = int(batch.wave_lens[k]) / sample_rate
        raise InputTooShort(
            f"utterance {batch.ids[k]} has {seconds:.3f} s of audio (after any speed "
            f"perturbation): {err}; give its manifest line the audio's duration, or drop it"
        ) from None


def _uses_grad_scaler(trainer: L.Trainer) -> bool:
    return getattr(trainer.precision_plugin, "scaler", None) is not None


def stage_manifests(module: L.LightningDataModule, stage: str) -> list[tuple[str, str]]:
    """The `(split, manifest)` pairs `stage` needs that `module.datasets` lacks."""
    hp = module.hparams
    stage = getattr(stage, "value", stage)  # Lightning passes its TrainerFn
    splits = {"train": hp.train_manifest, "val": hp.val_manifest, "test": hp.test_manifest}
    wanted = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"]}.get(stage, [])
    pairs = []
    for split in wanted:
        if split in module.datasets:
            continue
        if not splits[split]:
            raise ValueError(f"data.{split}_manifest is required for '{stage}'")
        pairs.append((split, splits[split]))
    return pairs


def bucketed_loader(
    module: L.LightningDataModule,
    dataset: Sequence,
    lengths: Sequence[float],
    max_batch_length: float,
    collate_fn: Callable,
    shuffle: bool,
    grid: LengthGrid | None = None,
    shortest_first_epochs: int = 0,
) -> torch.utils.data.DataLoader:
    """A DataLoader of length-bucketed batches sharded over ranks, set by `module.hparams`."""
    hp, trainer = module.hparams, module.trainer
    sampler = DynamicBucketSampler(
        lengths,
        max_batch_length,
        num_buckets=hp.num_buckets,
        max_batch_size=hp.max_batch_size,
        shuffle=shuffle,
        seed=hp.seed,
        num_replicas=trainer.world_size if trainer else 1,
        rank=trainer.global_rank if trainer else 0,
        grid=grid,
        shortest_first_epochs=shortest_first_epochs,
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collate_fn,
        num_workers=hp.num_workers,
        persistent_workers=hp.num_workers > 0,
        generator=torch.Generator().manual_seed(hp.seed),  # leaves the global RNG alone
    )
    # Lightning builds the first epoch's iterator before any epoch hook runs.
    set_loader_epoch(loader, trainer.current_epoch if trainer else 0)
    return loader


def _references(batch: Batch, attention: Tensor, enc_lens: Tensor) -> list[Hypothesis]:
    return [
        Hypothesis(batch.tokens[b, :n].tolist(), 0.0, attention[b, :, : n + 1, : int(t)])
        for b, (n, t) in enumerate(zip(batch.token_lens.tolist(), enc_lens))
    ]


class ResumableData(L.LightningDataModule):
    """A data module whose training loader's position is in the checkpoint, so that a run
    resumed mid-epoch trains the batches it had left (its module: `ExactResume`). A resume
    whose batches would differ (another world size or number of loader streams, shards
    written again, other batching options or data) starts that epoch again, with a warning."""

    def __init__(self) -> None:
        super().__init__()
        self._resume_sampler: dict | None = None
        self._resume_world: int | None = None  # the world size the resume point was made in

    def state_dict(self) -> dict:
        """The training sampler's position for a checkpoint: its epoch and processed batches."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != "fit" or trainer.train_dataloader is None:
            return {}
        sampler = _position_keeper(trainer.train_dataloader)
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        position = sampler.state_dict() | {"batches_yielded": done}
        return {"train_sampler": position, "world_size": trainer.world_size}

    def load_state_dict(self, state: dict) -> None:
        self._resume_sampler = state.get("train_sampler")
        self._resume_world = state.get("world_size")

    def _resumed(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        """The training `loader`, at the checkpoint's position where it resumes that epoch."""
        state, self._resume_sampler = self._resume_sampler, None
        if not state or self.trainer is None or state["epoch"] != self.trainer.current_epoch:
            return loader
        world, self._resume_world = self._resume_world, None
        keeper = _position_keeper(loader)
        # each world size deals out its own batches, and a stream's each loader worker count
        counts = (
            ("processes", world, self.trainer.world_size),
            ("loader worker streams", state.get("streams"), getattr(keeper, "streams", None)),
        )
        changed = [
            f"resumed with {now} {what} from a checkpoint of {then}"
            for what, then, now in counts
            if then not in (None, now)
        ]
        if state.get("seed") not in (None, keeper.seed):  # the rest of the run takes the new one
            changed.append(f"resumed with data.seed {keeper.seed} from a checkpoint of "
                           f"{state['seed']}")  # fmt: skip
        index = getattr(getattr(keeper, "index", None), "identity", None)
        if state.get("index") not in (None, index):
            changed.append(f"resumed on shards written again since the checkpoint ({index})")
        if not changed:
            keeper.load_state_dict(state)  # its seed too: the plan is compared under it
            plan = getattr(keeper, "plan_digest", lambda: None)()
            if state.get("plan") not in (None, plan):
                keeper.load_state_dict(state | {"batches_yielded": 0})
                changed.append("resumed with other batches than the checkpoint's (other "
                               "batching options or training data)")  # fmt: skip
        if changed:
            _restart_epoch(self.trainer)
            if self.trainer.is_global_zero:
                log.warning(
                    "%s: epoch %d starts again from its first batch (its batches depend on "
                    "them)", changed[0], state["epoch"],
                )  # fmt: skip
        return loader


class ASRDataModule(ResumableData):
    """Manifests -> length-bucketed batches of padded audio and tokens.

    Args:
        train_manifest: JSONL manifest for training, or a folder of `asr shard` shards
            (streamed: `asr.data.shards`).
        val_manifest: JSONL manifest for validation.
        tokenizer: directory written by `asr tokenizer`.
        test_manifest: optional JSONL manifest for `asr test`.
        sample_rate: audio is resampled to this rate.
        max_batch_seconds: padded seconds of audio per batch (batch size x longest utterance),
            by the manifest's durations: with speed perturbation at 0.9 a batch holds up to
            1/0.9 of it, but with shape_grid or from shards, which pack the perturbed lengths.
        max_batch_size: optional cap on utterances per batch.
        num_buckets: length buckets of the sampler.
        speed_perturb: speed factors drawn per training utterance, e.g. [0.9, 1.0, 1.1].
        shape_grid: ratio of a geometric grid of padded lengths (fixed shapes); None: off.
        num_workers: data loader worker processes.
        seed: sampler shuffling and perturbation seed.
        skip_bad: skip (and report) bad manifest lines instead of failing.
        check_audio: up-front audio check: "header" (readable, long enough) or "full" (decode).
        min_duration: utterances shorter than this (seconds) are bad lines.
        cache_audio: keep loaded waveforms in memory for later epochs (small corpora), with
            num_workers 0: each epoch's loader workers are new, their caches empty.
        augment: waveform augmentation of the training set (`asr.data.augment`).
        shortest_first_epochs: the first this many epochs batch shortest first (SortaGrad).
        shuffle_buffer: sharded training data: utterances each stream holds to shuffle.
    """

    def __init__(
        self,
        train_manifest: str,
        val_manifest: str,
        tokenizer: str,
        test_manifest: str | None = None,
        sample_rate: int = 16000,
        max_batch_seconds: float = 100.0,
        max_batch_size: int | None = None,
        num_buckets: int = 20,
        speed_perturb: list[float] | None = None,
        num_workers: int = 2,
        seed: int = 0,
        skip_bad: bool = False,
        check_audio: Literal["header", "full"] = "header",
        min_duration: float = MIN_DURATION,
        shape_grid: float | None = None,
        cache_audio: bool = False,
        augment: WaveAugment | None = None,
        shortest_first_epochs: int = 0,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    ):
        super().__init__()
        if check_audio not in ("header", "full"):
            raise ValueError(f"check_audio must be 'header' or 'full', got {check_audio!r}")
        if not max_batch_seconds > 0:  # named as set, before the sampler names its own budget
            raise ValueError(f"max_batch_seconds must be > 0, got {max_batch_seconds}")
        try:  # said as set: the grid's own words name its ratio
            self.grid = None if shape_grid is None else LengthGrid(shape_grid)
        except ValueError:
            raise ValueError(f"shape_grid must be finite and > 1, got {shape_grid}") from None
        # `augment` stays out of hparams: checkpoints keep plain types, loadable weights_only.
        save_hyperparameters(self, ["augment"])
        self.augmenter = None
        if augment is not None and augment.active:
            self.augmenter = WaveAugmenter(augment, sample_rate)
        self.tokenizer = Tokenizer.load(tokenizer, option="data.tokenizer")
        self.datasets: dict[str, SpeechDataset | ShardedSpeechDataset] = {}

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if hp.cache_audio and hp.num_workers > 0:
            log.warning(
                "data.cache_audio with data.num_workers %d caches nothing for later epochs: "
                "each epoch starts new loader workers, their caches empty (num_workers 0 keeps "
                "one cache for the whole fit)",
                hp.num_workers,
            )  # fmt: skip
        for split, manifest in stage_manifests(self, stage):
            train = split == "train"
            if train and is_shard_folder(manifest):
                self.datasets[split] = self._stream(manifest)
                continue
            utts = self._checked(manifest)
            self.datasets[split] = SpeechDataset(
                utts,
                self.tokenizer,
                hp.sample_rate,
                hp.speed_perturb if train else None,
                hp.seed,
                hp.cache_audio,
                self.augmenter if train else None,
            )

    def _stream(self, folder: str) -> ShardedSpeechDataset:
        """The training stream over a shard folder, its index and files checked up front."""
        hp, trainer = self.hparams, self.trainer
        if hp.shortest_first_epochs:
            raise ValueError("data.shortest_first_epochs needs a manifest, not shards: set it to 0")
        index = read_index(folder)
        check_vocabulary(index, self.tokenizer)
        short = int((index.durations < hp.min_duration).sum())
        if short:  # a manifest's lines are refused for this; a stream would fail mid-epoch
            raise ValueError(
                f"{folder}: {short} of its {len(index.durations)} utterances are shorter than "
                f"data.min_duration ({hp.min_duration:g} s): shard a manifest without them "
                f"(asr validate-data --min-duration {hp.min_duration:g} names them), or lower "
                "data.min_duration"
            )
        options = StreamOptions(
            hp.max_batch_seconds, hp.max_batch_size, hp.num_buckets, hp.shuffle_buffer,
            hp.speed_perturb, hp.seed,
        )  # fmt: skip
        return ShardedSpeechDataset(
            index, self.tokenizer, options, hp.sample_rate,
            num_replicas=trainer.world_size if trainer else 1,
            rank=trainer.global_rank if trainer else 0,
            num_workers=hp.num_workers, augment=self.augmenter, grid=self.grid,
        )  # fmt: skip

    def _checked(self, path: str) -> list:
        """Validate a manifest up front; with `skip_bad`, drop and list the bad lines."""
        hp = self.hparams
        check = "full" if hp.check_audio == "full" else True
        report = validate_manifest(path, self.tokenizer, check, min_duration=hp.min_duration)
        if report.bad and not self.hparams.skip_bad:
            raise ValueError(
                f"{format_bad_entries(report.bad)}\n{report.summary()}: fix these lines or set "
                "data.skip_bad=true to skip them"
            )
        if report.bad:
            log.warning(
                "%s; skipping the bad lines:\n%s", report.summary(), format_bad_entries(report.bad)
            )
        if not report.good:  # nothing to train on, or to choose checkpoints by
            raise ValueError(f"{report.summary()}: no utterance to use")
        return report.good

    def _loader(self, split: str, shuffle: bool) -> torch.utils.data.DataLoader:
        dataset = self.datasets[split]
        collate_fn = partial(collate, pad_id=self.tokenizer.pad_id)
        if self.grid is not None:
            collate_fn = partial(
                collate_fn,
                wave_length=partial(self.grid.samples, sample_rate=dataset.sample_rate),
                token_length=partial(round_up, multiple=TOKEN_MULTIPLE),
            )
        if isinstance(dataset, ShardedSpeechDataset):
            loader = stream_loader(dataset, collate_fn, self.hparams.seed)
            set_loader_epoch(loader, self.trainer.current_epoch if self.trainer else 0)
            return loader
        # Grid shapes must fit each epoch's perturbed lengths; else nominal durations pack better.
        lengths = dataset.durations if self.grid is None else dataset.lengths
        hp = self.hparams
        return bucketed_loader(
            self,
            dataset,
            lengths,
            hp.max_batch_seconds,
            collate_fn,
            shuffle,
            grid=self.grid,
            shortest_first_epochs=hp.shortest_first_epochs,
        )

    def train_dataloader(self):
        return self._resumed(self._loader("train", shuffle=True))

    def val_dataloader(self):
        return self._loader("val", shuffle=False)

    def test_dataloader(self):
        return self._loader("test", shuffle=False)


def _restart_epoch(trainer: L.Trainer) -> None:
    """Lightning's count of the resumed epoch's batches set back to its start, as the loader's:
    else it ends the epoch as many batches short as had been trained."""
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    # -1 where the checkpoint was saved at a batch's end: Lightning counts that batch done when
    # it restores, and so would the restarted epoch's first
    behind = current.completed - current.processed
    current.reset()
    current.completed = behind
    module = getattr(trainer, "lightning_module", None)
    if isinstance(module, ExactResume):  # nor are its means carried on
        module.forget_saved_epoch()


def _position_keeper(loader: torch.utils.data.DataLoader):
    """What holds a training loader's position: its batch sampler, or its stream of batches."""
    return loader.dataset if loader.batch_sampler is None else loader.batch_sampler
