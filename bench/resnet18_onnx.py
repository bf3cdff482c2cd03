"""ResNet-18 (torchvision's architecture) with deterministic random weights, exported to ONNX, and the
way back: torchvision's resnet18 loaded with the weights of such an ONNX file.

    python bench/resnet18_onnx.py resnet18.onnx [--weights tiled|random] [--seed 0]

The ONNX has opset 13, input `input` [N,3,224,224] float32 with a dynamic batch N, output `logits`
[N,1000]. BatchNorm is folded into the convolutions by the exporter (eval mode). Random weights are
fine for speed; the running statistics of every BatchNorm are set from one forward pass over a fixed
random batch, so activations stay O(1) through the 18 layers (fp16 neither overflows nor underflows).

Weights (`--weights`):
  random  every weight drawn independently: 46.8 MB that do not compress.
  tiled   (default) every conv/fc weight is w[o, i, kh, kw] = B[o, i mod 13, kh, kw] with B random:
          distinct output channels, the input-channel axis repeats with period 13 (prime, so no power-of-
          two blocking of a kernel lines up with it, and a kernel that mixes up input channels by 16 or 32
          still gives wrong outputs). The tensors then compress ~20x with gzip, also after a layout change
          to HWIO or a cast to fp16/int8 (per-output-channel scales keep the period), so the ONNX and
          bundles built from it fit in the 64 MiB that one transfer to the GPU machine may carry.
          The price: each layer sees only 13 sums of its input channels, and GPU energy readings may be
          a little lower than with incompressible weights (fewer bit flips). Speed does not depend on
          the values.

The model is `torchvision.models.resnet18` when torchvision imports, else `ResNet18` below, written
to have the same modules, names and forward (torchvision's state_dict loads into it with strict=True).
bench/gpu_vs_torch.py loads an exported file back into torchvision's model (`torchvision_from_onnx`)
to cross-check the ONNX peer (bench/onnx_torch.py) against torchvision on the GPU machine.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

PERIOD = 13


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # torchvision's order: the shortcut last
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision.models.resnet18's twin (same state_dict keys, same forward), for hosts without it."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, cin, layers = (64, 128, 256, 512), 64, []
        for i, w in enumerate(widths):
            layers.append(nn.Sequential(BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)))
            cin = w
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18() -> tuple[nn.Module, str]:
    """torchvision's resnet18 (random init, no download) when it imports, else the twin above."""
    try:
        import torchvision

        return torchvision.models.resnet18(weights=None), f"torchvision {torchvision.__version__}"
    except Exception:  # not installed, or its C extension does not load (e.g. with a CPU-only torch)
        return ResNet18(), "bench/resnet18_onnx.py ResNet18 (torchvision's structure)"


def _weight(rng: np.random.Generator, shape: tuple[int, ...], std: float, tiled: bool) -> np.ndarray:
    if not tiled or len(shape) < 2 or shape[1] <= PERIOD:
        return (rng.standard_normal(shape) * std).astype(np.float32)
    block = rng.standard_normal((shape[0], PERIOD, *shape[2:])) * std
    return block[:, np.arange(shape[1]) % PERIOD].astype(np.float32)


@torch.no_grad()
def set_weights(model: nn.Module, seed: int, tiled: bool) -> None:
    """Deterministic weights (numpy's PCG64 from `seed`), then BatchNorm statistics from one pass."""
    rng = np.random.default_rng(seed)

    def put(p: torch.Tensor, value: np.ndarray) -> None:
        p.copy_(torch.from_numpy(value.astype(np.float32)))

    for m in model.modules():  # torchvision and the twin register their modules in the same order
        if isinstance(m, nn.Conv2d):  # He normal (fan-in)
            put(m.weight, _weight(rng, tuple(m.weight.shape), float(np.sqrt(2.0 / m.weight[0].numel())), tiled))
        elif isinstance(m, nn.BatchNorm2d):
            put(m.weight, 1.0 + 0.1 * rng.standard_normal(m.num_features))
            put(m.bias, 0.1 * rng.standard_normal(m.num_features))
        elif isinstance(m, nn.Linear):
            put(m.weight, _weight(rng, tuple(m.weight.shape), float(np.sqrt(1.0 / m.in_features)), tiled))
            put(m.bias, 0.1 * rng.standard_normal(m.out_features))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average: one pass sets the statistics of that batch
    # The statistics pass runs in float64 and its results are rounded to STAT_BITS significant bits, so that
    # every CPU writes the same file: in float32 the convolution kernels torch picks per CPU (AVX2, AVX-512,
    # AMD or Intel) gave three different files, hence three tuning-database names (docs/tuning.md). float64
    # results differ across CPUs by ~1e-13 relative; a rounding to 10 bits flips only for a value within that
    # of a rounding boundary (~1e-10 per value, ~1e-6 for the model's 9,600).
    model.double().train()
    model(torch.from_numpy(rng.standard_normal((16, 3, 224, 224))))
    model.float().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None
            m.running_mean.copy_(_rounded(m.running_mean))
            m.running_var.copy_(_rounded(m.running_var))


STAT_BITS = 10


def _rounded(t: torch.Tensor) -> torch.Tensor:
    """`t` rounded to STAT_BITS significant bits (exact in float32)."""
    mantissa, exponent = torch.frexp(t.double())
    return torch.ldexp(torch.round(mantissa * 2.0**STAT_BITS) / 2.0**STAT_BITS, exponent.double()).float()


def export(out: Path, seed: int, tiled: bool) -> str:
    model, source = resnet18()
    set_weights(model, seed, tiled)
    x = torch.zeros(1, 3, 224, 224)
    with warnings.catch_warnings():  # torch >= 2.9 warns that this exporter is the legacy one: chosen on purpose
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (x,),
            str(out),
            dynamo=False,  # the TorchScript exporter: needs no onnxscript, folds BatchNorm into Conv
            opset_version=13,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
            do_constant_folding=True,
        )
    onnx.checker.check_model(str(out))
    # the ONNX must compute what the torch model computes (onnxruntime is a dependency of edgedeploy)
    import onnxruntime as ort

    xs = np.random.default_rng(seed + 1).uniform(-2, 2, (2, 3, 224, 224)).astype(np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": xs})[0]
    with torch.no_grad():
        want = model(torch.from_numpy(xs)).numpy()
    err = float(np.abs(got - want).max() / np.abs(want).max())
    if err > 1e-4:
        raise SystemExit(f"exported ONNX differs from the torch model: relative max error {err:.2e}")
    return f"{source}; onnxruntime vs torch relative max error {err:.1e}"


def torchvision_from_onnx(path: str) -> tuple[nn.Module, str]:
    """torchvision's resnet18 (or the twin) holding the weights of an ONNX file from `export`.

    The exporter folded each BatchNorm into its Conv (weight and a new bias); Conv nodes come in the
    same order as the model's Conv2d modules. Each BatchNorm is set to add the folded bias: mean 0,
    var 1, gamma sqrt(1 + eps), beta = bias. Shapes are checked one by one.
    """
    model, source = resnet18()
    g = onnx.load(path).graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    convs = [n for n in g.node if n.op_type == "Conv"]
    gemms = [n for n in g.node if n.op_type == "Gemm"]
    mods = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    if any(n.op_type == "BatchNormalization" for n in g.node) or len(convs) != len(mods) or len(gemms) != 1:
        raise ValueError(f"{path} is not a BatchNorm-folded ResNet-18 export")
    with torch.no_grad():
        for node, conv, bn in zip(convs, mods, bns, strict=True):
            w, b = inits[node.input[1]], inits[node.input[2]]
            if tuple(conv.weight.shape) != w.shape:
                raise ValueError(f"{node.name}: weight {w.shape} where resnet18 has {tuple(conv.weight.shape)}")
            conv.weight.copy_(torch.from_numpy(w.copy()))
            bn.running_mean.zero_()
            bn.running_var.fill_(1.0)
            bn.weight.fill_(float(np.sqrt(1.0 + bn.eps)))
            bn.bias.copy_(torch.from_numpy(b.copy()))
        fc_w, fc_b = inits[gemms[0].input[1]], inits[gemms[0].input[2]]
        model.fc.weight.copy_(torch.from_numpy(fc_w.copy()))
        model.fc.bias.copy_(torch.from_numpy(fc_b.copy()))
    return model.eval(), source


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--weights", choices=("tiled", "random"), default="tiled")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    note = export(args.out, args.seed, args.weights == "tiled")
    data = args.out.read_bytes()
    print(
        f"{args.out}: {len(data) / 1e6:.1f} MB, gzip -6 {len(gzip.compress(data, 6)) / 1e6:.1f} MB, "
        f"sha256 {hashlib.sha256(data).hexdigest()}, weights {args.weights} seed {args.seed}; {note}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
