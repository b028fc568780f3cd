"""Deterministic data for the study.

The n-th *global* batch depends only on (source, seed, n): every strategy and world size
trains on the same samples in the same order. Data-parallel ranks take contiguous equal
slices of the global batch; tensor- and pipeline-parallel ranks take all of it.

Sources:
- synthetic (default): fixed-shape batches made from a seeded generator.
  GPT: each sequence is an arithmetic progression modulo the vocabulary (random start,
  random stride from 1..7), so the loss falls as the model learns in-context.
  ResNet: N(0, 1) images, labelled by a fixed random linear teacher on 4x4 average-pooled
  pixels, so the labels are learnable.
- a text file (GPT): its bytes are the tokens (vocabulary 256); sequence i of batch n
  starts at a seeded random offset. A corpus folder made by bench/corpus.py (its
  ``corpus.json`` beside ``train.txt`` and ``val.txt``) trains on ``train.txt``.
- a folder of .npy images (ResNet): either ``images.npy`` (N, 32, 32, 3) or (N, 3, 32, 32)
  with ``labels.npy`` (N,), or class sub-folders ``<class>/*.npy`` of single images.

Held-out sequences (``held_out``, GPT: the trainer's --eval-every): a fixed set, the same
for every strategy, world size and seed: windows at evenly spaced offsets of the held-out
text (--eval-data, or a corpus folder's ``val.txt``); for synthetic data, sequences drawn
from the same generator under another seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

Batch = tuple[torch.Tensor, torch.Tensor]

_GPT_SALT = 0x6770_7432
_IMG_SALT = 0x7265_736E
_HELD_OUT_SALT = 0x6865_6C64

# A corpus folder (bench/corpus.py): the manifest, the training and the held-out text.
CORPUS_MANIFEST, CORPUS_TRAIN, CORPUS_VAL = "corpus.json", "train.txt", "val.txt"


class Source(Protocol):
    def global_batch(self, step: int) -> Batch: ...


def _generator(seed: int, salt: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + salt * 7919 + step) % (2**63))


class SyntheticTokens:
    def __init__(self, vocab_size: int, seq_len: int, batch: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.batch, self.seed = vocab_size, seq_len, batch, seed

    def global_batch(self, step: int) -> Batch:
        gen = _generator(self.seed, _GPT_SALT, step)
        start = torch.randint(0, self.vocab_size, (self.batch, 1), generator=gen)
        stride = torch.randint(1, 8, (self.batch, 1), generator=gen)
        pos = torch.arange(self.seq_len + 1).unsqueeze(0)
        seq = (start + stride * pos) % self.vocab_size
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def _byte_tokens(path: Path, seq_len: int) -> torch.Tensor:
    raw = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    if raw.size < seq_len + 2:
        raise ValueError(f"{path}: {raw.size} bytes, need at least {seq_len + 2}")
    return torch.from_numpy(raw.astype(np.int64))


def is_corpus(path: Path) -> bool:
    """A corpus folder prepared by bench/corpus.py."""
    return path.is_dir() and (path / CORPUS_MANIFEST).is_file()


class TextFileTokens:
    """Bytes of a local text file as tokens (vocabulary 256)."""

    def __init__(self, path: Path, seq_len: int, batch: int, seed: int) -> None:
        self.tokens = _byte_tokens(path, seq_len)
        self.seq_len, self.batch, self.seed = seq_len, batch, seed

    def global_batch(self, step: int) -> Batch:
        gen = _generator(self.seed, _GPT_SALT, step)
        starts = torch.randint(0, self.tokens.numel() - self.seq_len - 1, (self.batch,),
                               generator=gen)
        idx = starts.unsqueeze(1) + torch.arange(self.seq_len + 1).unsqueeze(0)
        seq = self.tokens[idx]
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


class SyntheticImages:
    def __init__(self, batch: int, seed: int, num_classes: int = 10, size: int = 32) -> None:
        self.batch, self.seed, self.num_classes, self.size = batch, seed, num_classes, size
        teacher_gen = torch.Generator().manual_seed(seed + _IMG_SALT)
        cells = 3 * (size // 4) ** 2
        self.teacher = torch.randn(cells, num_classes, generator=teacher_gen)

    def global_batch(self, step: int) -> Batch:
        gen = _generator(self.seed, _IMG_SALT, step)
        x = torch.randn(self.batch, 3, self.size, self.size, generator=gen)
        pooled = torch.nn.functional.avg_pool2d(x, 4).flatten(1)
        return x, (pooled @ self.teacher).argmax(dim=1)


class NpyImages:
    """A folder of .npy images; batches are seeded random draws (with replacement)."""

    def __init__(self, folder: Path, batch: int, seed: int) -> None:
        self.batch, self.seed = batch, seed
        images_file, labels_file = folder / "images.npy", folder / "labels.npy"
        if images_file.is_file():
            images = np.load(images_file)
            labels = (np.load(labels_file) if labels_file.is_file()
                      else np.zeros(len(images), dtype=np.int64))
        else:
            classes = sorted(p for p in folder.iterdir() if p.is_dir())
            items = [(np.load(f), k) for k, c in enumerate(classes) for f in sorted(c.glob("*.npy"))]
            if not items:
                raise ValueError(f"{folder}: no images.npy and no <class>/*.npy files")
            images = np.stack([img for img, _ in items])
            labels = np.array([k for _, k in items], dtype=np.int64)
        if images.ndim != 4:
            raise ValueError(f"{folder}: images must be (N, H, W, 3) or (N, 3, H, W)")
        if images.shape[-1] == 3 and images.shape[1] != 3:
            images = images.transpose(0, 3, 1, 2)
        data = torch.from_numpy(np.ascontiguousarray(images)).float()
        if images.dtype == np.uint8:
            data = data / 255.0
        # Per-channel standardisation, as CIFAR-10 training does.
        mean = data.mean(dim=(0, 2, 3), keepdim=True)
        std = data.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
        self.images = (data - mean) / std
        self.labels = torch.from_numpy(labels.astype(np.int64))
        self.num_classes = int(self.labels.max()) + 1

    def global_batch(self, step: int) -> Batch:
        gen = _generator(self.seed, _IMG_SALT, step)
        idx = torch.randint(0, len(self.images), (self.batch,), generator=gen)
        return self.images[idx], self.labels[idx]


def make_source(model: str, batch: int, seq_len: int, vocab_size: int, seed: int,
                data: str | None) -> Source:
    """The global-batch source for `model` (synthetic unless `data` names a file/folder)."""
    if data is None:
        if model == "resnet18":
            return SyntheticImages(batch, seed)
        return SyntheticTokens(vocab_size, seq_len, batch, seed)
    path = Path(data)
    if model == "resnet18":
        if not path.is_dir():
            raise ValueError(f"--data for resnet18 must be a folder of .npy images: {path}")
        return NpyImages(path, batch, seed)
    if is_corpus(path):
        path = path / CORPUS_TRAIN
    if not path.is_file():
        raise ValueError(f"--data for GPT models must be a text file or a corpus folder "
                         f"(bench/corpus.py): {path}")
    if vocab_size < 256:
        raise ValueError(f"a text file needs a vocabulary of >= 256 (bytes), model has {vocab_size}")
    return TextFileTokens(path, seq_len, batch, seed)


def held_out_text(data: str | None, eval_data: str | None) -> Path | None:
    """The held-out text file: eval_data (a text file, or a corpus folder's val.txt), else
    the --data corpus folder's val.txt; None for synthetic data. ValueError where --data is
    a plain text file and nothing is held out of it."""
    if eval_data is not None:
        path = Path(eval_data)
        if is_corpus(path):
            return path / CORPUS_VAL
        if path.is_file():
            return path
        raise ValueError(f"--eval-data must be a text file or a corpus folder "
                         f"(bench/corpus.py): {path}")
    if data is None:
        return None
    if is_corpus(Path(data)):
        return Path(data) / CORPUS_VAL
    raise ValueError(f"--data {data} holds nothing out: give --eval-data FILE, or a corpus "
                     f"folder (bench/corpus.py) as --data")


def held_out(seq_len: int, vocab_size: int, seed: int, data: str | None,
             eval_data: str | None, sequences: int) -> tuple[Batch, str]:
    """`sequences` held-out GPT sequences (inputs, targets) and what they are: windows of
    the held-out text at evenly spaced offsets (the same whatever the seed), or for
    synthetic data draws of the same generator under another seed."""
    if sequences < 1:
        raise ValueError(f"{sequences} held-out sequences: need at least one")
    path = held_out_text(data, eval_data)
    if path is None:
        gen = SyntheticTokens(vocab_size, seq_len, sequences, seed ^ _HELD_OUT_SALT)
        return gen.global_batch(0), f"synthetic, {sequences} sequences of another seed"
    tokens = _byte_tokens(path, seq_len)
    last = tokens.numel() - seq_len - 1
    starts = torch.tensor([i * last // max(1, sequences - 1) for i in range(sequences)])
    seq = tokens[starts.unsqueeze(1) + torch.arange(seq_len + 1).unsqueeze(0)]
    return ((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()),
            f"{path}: {sequences} windows of {seq_len} tokens at evenly spaced offsets")


def shard(batch: Batch, rank: int, world: int) -> Batch:
    """This data-parallel rank's contiguous slice of a global batch."""
    x, y = batch
    if x.shape[0] % world:
        raise ValueError(f"global batch {x.shape[0]} is not divisible by {world} data-parallel ranks")
    per = x.shape[0] // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
