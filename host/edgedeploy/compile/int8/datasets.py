"""Real data for calibration and accuracy checks, preprocessed by the agent's one implementation.

Calibration sources: an image folder, a video file, `.npy` batches or MNIST idx files. Labeled sets: an ImageNet-style
folder of `wnid_name.jpg` files, a folder of class subfolders, or MNIST idx files (optionally gzipped).
Calibration and evaluation images come from one folder without overlap through `split_of`, a
deterministic split by a hash of the file name.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import cv2
import numpy as np

from edgedeploy_agent.bundle import Preprocess, TensorSpec
from edgedeploy_agent.preprocess import preprocess

from ...errors import InputError
from ...userfiles import read_text

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".webm")
Split = Literal["all", "calibration", "evaluation"]


def split_of(name: str) -> Literal["calibration", "evaluation"]:
    """Which half a file belongs to: the first byte of sha1(file name) below 128 is calibration."""
    return "calibration" if hashlib.sha1(name.encode()).digest()[0] < 128 else "evaluation"


def list_images(folder: Path, split: Split = "all") -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    return [p for p in files if split == "all" or split_of(p.name) == split]


def read_image(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise InputError(f"cannot read image {path} (not an image or corrupt)")
    return img


def load_calibration(
    source: Path, pp: Preprocess, spec: TensorSpec, count: int, split: Split = "calibration"
) -> np.ndarray:
    """Up to `count` preprocessed calibration inputs, stacked on the batch axis."""
    if count < 1:
        raise InputError(f"calibration sample count must be at least 1, got {count}")
    if not source.exists():
        raise InputError(f"calibration source {source} does not exist")
    if source.is_dir() and _idx_pair(source) is not None:
        images, _, _ = _read_mnist(source, split)
        batch = np.concatenate([preprocess(img, pp, spec) for img in images[:count]])
    elif source.is_dir() and any(source.glob("*.npy")):
        batch = _npy_batches(source, spec)
    elif source.suffix == ".npy":
        batch = _npy_batches(source, spec)
    elif source.is_dir():
        files = list_images(source, split) or list_images(source)
        if not files:
            raise InputError(f"calibration folder {source} holds no images ({', '.join(IMAGE_SUFFIXES)}) or .npy")
        batch = np.concatenate([preprocess(read_image(p), pp, spec) for p in files[:count]])
    elif source.suffix.lower() in VIDEO_SUFFIXES:
        batch = np.concatenate(list(_video_frames(source, pp, spec, count)))
    else:
        raise InputError(f"calibration source {source} is not an image folder, a video file or .npy batches")
    return batch[:count]


def _npy_batches(source: Path, spec: TensorSpec) -> np.ndarray:
    files = sorted(source.glob("*.npy")) if source.is_dir() else [source]
    arrays = []
    for f in files:
        try:
            a = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read calibration batch {f}: {e}") from None
        if a.ndim == len(spec.shape) - 1:
            a = a[None]
        if list(a.shape[1:]) != list(spec.shape[1:]):
            raise InputError(
                f"calibration batch {f} has shape {list(a.shape)}, input {spec.name} wants [N, "
                f"{', '.join(map(str, spec.shape[1:]))}]"
            )
        arrays.append(a.astype(np.dtype(spec.dtype)))
    if not arrays:
        raise InputError(f"calibration source {source} holds no .npy batches")
    return np.concatenate(arrays)


def _video_frames(path: Path, pp: Preprocess, spec: TensorSpec, count: int) -> Iterator[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise InputError(f"cannot open calibration video {path} (unsupported codec or corrupt file)")
    total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) or count
    step = max(1, total // count)  # spread the samples over the whole clip
    n = i = 0
    try:
        while n < count:
            ok, frame = cap.read()
            if not ok:
                break
            if i % step == 0:
                n += 1
                yield preprocess(frame, pp, spec)
            i += 1
    finally:
        cap.release()
    if n == 0:
        raise InputError(f"calibration video {path} has no readable frames")


@dataclass
class LabeledSet:
    """Preprocessed inputs and their class indices (0-based, before any output offset)."""

    name: str
    inputs: np.ndarray
    labels: np.ndarray
    kind: str
    classes: int | None = None  # the size of the set's label space (synset list, class folders, idx labels)

    def __len__(self) -> int:
        return len(self.labels)

    def check_fits(self, outputs: int, label_offset: int, what: str) -> None:
        """Refuse (InputError) to score a model on a set whose label space is not its own: `outputs` scores
        per sample minus `label_offset` must be the set's classes. A 10-class model on 1000-class photos
        scored 10 %, a 1001-output model read with offset 0 on ImageNet about 0 % (issue 35)."""
        if self.classes is None or outputs - label_offset == self.classes:
            return
        extra = outputs - self.classes
        if extra == 1:
            hint = "if output 0 is 'background', set label_offset = 1 in the model card (build --label-offset 1)"
        elif extra == 0:
            hint = "the model has one output per class: label_offset = 0 in the model card"
        else:
            hint = "evaluate on a labeled set of the model's own classes (or the model that was trained on this one)"
        raise InputError(
            f"{what} has {outputs} outputs (label offset {label_offset}: {outputs - label_offset} classes), but "
            f"{self.name} has {self.classes} classes: its top-1 would mean nothing",
            hint=hint,
        )


def load_labeled(
    data: Path,
    pp: Preprocess,
    spec: TensorSpec,
    split: Split = "all",
    limit: int | None = None,
    synsets: Path | None = None,
) -> LabeledSet:
    """Read a labeled set: MNIST idx files, class subfolders, or ImageNet-style `wnid_name.jpg` files."""
    if not data.exists():
        raise InputError(f"evaluation data {data} does not exist")
    if data.is_dir() and _idx_pair(data) is not None:
        images, labels, digits = _read_mnist(data, split)
        images, labels = images[:limit], labels[:limit]
        x = np.concatenate([preprocess(img, pp, spec) for img in images]) if len(images) else np.zeros((0,))
        return LabeledSet(str(data), x, labels.astype(np.int64), "mnist-idx", digits)
    if not data.is_dir():
        raise InputError(f"evaluation data {data} is not a folder (image folder, class subfolders or MNIST idx)")
    subdirs = sorted(d for d in data.iterdir() if d.is_dir())
    files = list_images(data, split)[:limit]
    if not files:
        raise InputError(f"evaluation folder {data} holds no images for split {split!r}")
    if subdirs and all(f.parent != data for f in files):
        syn = synsets or _find_synsets(data)
        classes = _class_names(syn) if syn is not None else []
        folders = [d.name for d in subdirs]
        # wnid-named folders follow the synset order; any other names are classes in sorted order
        names = classes if synsets is not None or (classes and set(folders) <= set(classes)) else folders
        index = {n: i for i, n in enumerate(names)}
        keys, kind = [f.parent.name for f in files], "class-folders"
    else:
        syn = synsets or _find_synsets(data)
        if syn is None:
            raise InputError(
                f"{data}: wnid-named images need the synset list (imagenet_synsets_1000.txt)",
                hint="pass --synsets FILE (one 'wnid name' per line in class-index order)",
            )
        index = {n: i for i, n in enumerate(_class_names(syn))}
        keys, kind = [f.name.split("_", 1)[0] for f in files], "imagenet-wnid"
    unknown = sorted({k for k in keys if k not in index})
    if unknown:
        raise InputError(f"{data}: {len(unknown)} labels are not known classes, e.g. {unknown[0]!r}")
    x = np.concatenate([preprocess(read_image(f), pp, spec) for f in files])
    return LabeledSet(str(data), x, np.array([index[k] for k in keys], dtype=np.int64), kind, len(index))


def _find_synsets(data: Path) -> Path | None:
    for cand in (data / "synsets.txt", data.parent / "labels" / "imagenet_synsets_1000.txt"):
        if cand.is_file():
            return cand
    return None


def _class_names(path: Path) -> list[str]:
    return [line.split()[0] for line in read_text(path, "synset list").splitlines() if line.strip()]


def _idx_pair(data: Path) -> tuple[Path, Path] | None:
    images = sorted(data.glob("*images-idx3-ubyte*"))
    labels = sorted(data.glob("*labels-idx1-ubyte*"))
    return (images[0], labels[0]) if images and labels else None


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise InputError(f"cannot read idx file {path}: {e}") from None
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 8:
        raise InputError(f"{path} is not an unsigned-byte idx file")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise InputError(f"{path} is truncated: header says {dims}, body has {body.size} bytes")
    return body.reshape(dims)


def _read_mnist(data: Path, split: Split) -> tuple[np.ndarray, np.ndarray, int]:
    """Images and labels of an idx pair (and the classes: the largest label of the whole file + 1); sample i
    is split by the hash of "<images file>:<i>"."""
    pair = _idx_pair(data)
    assert pair is not None
    images, labels = _read_idx(pair[0]), _read_idx(pair[1])
    if len(images) != len(labels):
        raise InputError(f"{data}: {len(images)} images but {len(labels)} labels")
    classes = int(labels.max()) + 1 if len(labels) else 0
    if split != "all":
        keep = np.array([split_of(f"{pair[0].name}:{i}") == split for i in range(len(images))], dtype=bool)
        images, labels = images[keep], labels[keep]
    return images, labels, classes


def read_mnist(data: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every image (N, rows, cols; uint8) and label of an MNIST idx folder (the demo trains on them)."""
    if not data.is_dir() or _idx_pair(data) is None:
        raise InputError(f"{data} holds no MNIST idx files (*-images-idx3-ubyte[.gz] and *-labels-idx1-ubyte[.gz])")
    images, labels, _ = _read_mnist(data, "all")
    return images, labels
