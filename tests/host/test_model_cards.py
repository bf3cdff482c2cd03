"""No silently wrong numbers (issue 35): a model without a card takes its preprocessing from the command line
or the model file, or is refused with the card fields to give; `card init` writes a starter card; `eval`
refuses a labeled set whose classes are not the model's. None of these tests compiles."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from edgedeploy.compile.cards import ModelCard, card_with, load_card
from edgedeploy.compile.frontends.onnx_model import implied_color, load_onnx
from edgedeploy.compile.model_facts import complete_card, read_facts
from edgedeploy.errors import InputError
from edgedeploy_agent.bundle import Preprocess
from tests.agent.bundles import make_bundle
from tests.helpers import Cli, assert_one_line_error
from tests.host.frontends import needs_tflite


def _copy(src: Path, dst: Path, **props: str) -> Path:
    """The model with another doc string (so another sha256: no built-in card names it) and metadata_props."""
    m = onnx.load(src)
    m.doc_string = "a copy no card names"
    if props:
        onnx.helper.set_model_props(m, props)
    onnx.save(m, dst)
    return dst


@pytest.fixture
def mobilenet(data_dir: Path, tmp_path: Path) -> Path:
    return _copy(data_dir / "models" / "mobilenet_v1_0.25_224.onnx", tmp_path / "mnv1.onnx")


@pytest.fixture
def digits(data_dir: Path, tmp_path: Path) -> Path:
    return _copy(data_dir / "models" / "mnist-8_opset13.onnx", tmp_path / "digits.onnx")


def test_a_build_without_card_or_preprocessing_is_refused_with_the_fields_to_give(
    cli: Cli, tmp_path: Path, mobilenet: Path, digits: Path
) -> None:
    out = tmp_path / "out" / "m.edb"
    r = cli("build", str(mobilenet), "--profile", "cpu-x86_64", "-o", str(out))
    assert_one_line_error(r, 2, "mnv1.onnx has no model card and does not say how to preprocess its 3-channel input")
    assert "give preprocess.color, preprocess.mean, preprocess.std" in r.err
    assert f"edgedeploy card init {mobilenet} -o mnv1.toml" in r.err and "--color and --mean/--std" in r.err
    # a colour alone is not enough: the normalisation decides the numbers as much
    r = cli("build", str(mobilenet), "--profile", "cpu-x86_64", "--color", "rgb", "-o", str(out))
    assert_one_line_error(r, 2, "give preprocess.mean, preprocess.std")
    assert "preprocess.color" not in r.err
    # one channel can only be gray: only the normalisation is asked for, and no colour is blamed
    r = cli("build", str(digits), "--profile", "cpu-x86_64", "-o", str(out))
    assert_one_line_error(r, 2, "its 1-channel input: give preprocess.mean, preprocess.std")
    assert "color" not in r.err.split("hint:")[0]
    assert not out.parent.exists()


def test_a_one_channel_model_is_gray_unless_someone_chose_a_colour(cli: Cli, tmp_path: Path, digits: Path) -> None:
    """Issue 35: the error blamed `color rgb`, the default nobody set. Here the first thing wrong is the mean."""
    out = ["-o", str(tmp_path / "out" / "m.edb")]
    r = cli("build", str(digits), "--profile", "cpu-x86_64", "--mean", "1,2,3", *out)
    assert_one_line_error(r, 2, "mean has 3 values, but input Input3 of digits.onnx has 1 channel")
    card = tmp_path / "card.toml"
    card.write_text('name = "digits"\n[preprocess]\nmean = [1.0, 2.0, 3.0]\n')  # a card without a colour
    r = cli("build", str(digits), "--profile", "cpu-x86_64", "--card", str(card), *out)
    assert_one_line_error(r, 2, "mean has 3 values, but input Input3 of digits.onnx has 1 channel")
    r = cli("build", str(digits), "--profile", "cpu-x86_64", "--color", "rgb", "--scale", "1", *out)
    assert_one_line_error(r, 2, "color rgb gives 3 channels")  # chosen: then it is the colour that is wrong
    model = load_onnx(digits)
    assert implied_color(model, Preprocess()).color == "gray"
    assert implied_color(model, Preprocess(color="bgr")).color == "bgr"
    kept = card_with(load_card(card), labels=None, preprocess={"std": [255.0]}).preprocess
    assert kept.model_fields_set == {"mean", "std"} and implied_color(model, kept).color == "gray"


def test_preprocessing_is_read_from_onnx_metadata(data_dir: Path, tmp_path: Path, mobilenet: Path) -> None:
    src = data_dir / "models" / "mobilenet_v1_0.25_224.onnx"
    named = _copy(src, tmp_path / "named.onnx", preprocess="TF")
    card, note = complete_card(named, ModelCard(), set())
    assert (card.preprocess.color, card.preprocess.mean, card.preprocess.std) == ("rgb", [127.5], [127.5])
    assert note is not None and "preprocess = 'TF'" in note
    described = _copy(src, tmp_path / "json.onnx", preprocessing=json.dumps({"color": "bgr", "mean": [1, 2, 3]}))
    with pytest.raises(InputError, match="give preprocess.mean, preprocess.std"):  # a mean without a std
        complete_card(described, ModelCard(), set())
    card, _ = complete_card(described, ModelCard(), {"std"})
    assert (card.preprocess.color, card.preprocess.std) == ("bgr", [1.0])  # the options win, the model's
    assert card.preprocess.mean == [0.0]  # normalisation is not mixed with theirs
    winml = _copy(src, tmp_path / "winml.onnx", **{
        "Image.BitmapPixelFormat": "Bgr8", "Image.NominalPixelRange": "Normalized_0_1"})  # fmt: skip
    card, _ = complete_card(winml, ModelCard(), set())
    assert (card.preprocess.color, card.preprocess.mean, card.preprocess.std) == ("bgr", [0.0], [255.0])
    unknown = _copy(src, tmp_path / "odd.onnx", normalization="yolo")
    with pytest.raises(InputError, match="'yolo' names no known preprocessing"):
        complete_card(unknown, ModelCard(), set())
    # what the user gave is kept; without a card nor metadata nothing is guessed
    card, note = complete_card(mobilenet, ModelCard(), {"color", "mean", "std"})
    assert note is None and card == ModelCard()


@needs_tflite
def test_preprocessing_and_labels_are_read_from_tflite_metadata(data_dir: Path, tmp_path: Path) -> None:
    qat = tmp_path / "qat.tflite"  # Google's QAT MobileNet with tflite-support metadata, under another hash
    qat.write_bytes((data_dir / "models" / "mobilenet_v1_0.25_224_quant.tflite").read_bytes() + b"\0" * 8)
    facts = read_facts(qat)
    assert facts.preprocess == {"color": "rgb"} and facts.found_in == "the model's TFLite metadata"
    assert facts.labels is not None and len(facts.labels) == 1001 and facts.labels[:2] == ["background", "tench"]
    card, note = complete_card(qat, ModelCard(), set())
    # a uint8 input takes raw pixels (its own quantization normalises them), as the built-in card says
    assert (card.preprocess.color, card.preprocess.mean, card.preprocess.std) == ("rgb", [0.0], [1.0])
    assert card.labels == facts.labels and note is not None and "1001 labels" in note
    plain = data_dir / "models" / "mobilenet_v1_0.25_224_float.tflite"  # no metadata: nothing said
    assert read_facts(plain).preprocess == {} and read_facts(plain).labels is None


def test_card_init_writes_a_starter_card_that_is_refused_until_filled_in(
    cli: Cli, tmp_path: Path, mobilenet: Path, digits: Path
) -> None:
    card = tmp_path / "mnv1.toml"
    r = cli("card", "init", str(mobilenet), "-o", str(card))
    assert r.code == 0, r.err
    assert "fill in preprocess.color, preprocess.mean, preprocess.std, postprocess.label_offset" in r.err
    text = card.read_text()
    assert "# input:  input [1, 3, 224, 224] float32 NCHW" in text and "(last op Softmax)" in text
    assert f'source_sha256 = "{load_onnx(mobilenet).sha256}"' in text
    r = cli("build", str(mobilenet), "--profile", "cpu-x86_64", "--card", str(card), "-o", str(tmp_path / "x.edb"))
    assert_one_line_error(r, 2, "still has a TODO in preprocess.color, preprocess.mean, preprocess.std")
    assert_one_line_error(cli("card", "init", str(mobilenet), "-o", str(card)), 2, "exists")
    filled = []
    for line in text.splitlines():
        key = line.split(" = ")[0]
        values = {"color": '"rgb"', "mean": "[127.5]", "std": "[127.5]", "label_offset": "1"}
        filled.append(f"{key} = {values[key]}" if '= "TODO' in line else line)
    card.write_text("\n".join(filled) + "\n")
    loaded = load_card(card)
    assert (loaded.preprocess.color, loaded.preprocess.std, loaded.postprocess.label_offset) == ("rgb", [127.5], 1)
    # to stdout; a one-channel input needs no colour
    r = cli("card", "init", str(digits))
    assert r.code == 0 and 'color = "gray"' in r.out and 'mean = "TODO' in r.out, r.out
    assert "label_offset = 0" in r.out and "Plus214_Output_0 ['N', 10]" in r.out


def test_eval_refuses_a_labeled_set_of_other_classes(cli: Cli, data_dir: Path, tmp_path: Path) -> None:
    photos = str(data_dir / "imagenet-sample")
    toy = make_bundle(tmp_path / "toy")  # 10 outputs, like a digit classifier
    r = cli("eval", str(toy), "--data", photos, "--limit", "5")
    assert_one_line_error(r, 2, "bundle toy-1.edb has 10 outputs (label offset 0: 10 classes), but")
    assert "has 1000 classes" in r.err and "own classes" in r.err
    mnist = data_dir / "models" / "mnist-8_opset13.onnx"
    assert_one_line_error(cli("eval", str(mnist), "--data", photos, "--limit", "5"), 2, "has 1000 classes")
    # 1001 outputs read with offset 0: every prediction one class off; the hint names label_offset
    card = tmp_path / "offset0.toml"
    card.write_text('[preprocess]\ncolor = "rgb"\nmean = [127.5]\nstd = [127.5]\n')
    r = cli("eval", str(data_dir / "models" / "mobilenet_v1_0.25_224.onnx"), "--data", photos, "--card", str(card))
    assert_one_line_error(r, 2, "has 1001 outputs (label offset 0: 1001 classes)")
    assert "label_offset = 1" in r.err
    r = cli("eval", str(mnist), "--data", str(data_dir / "mnist"), "--limit", "20", "--json")
    assert r.code == 0 and json.loads(r.out)["onnxruntime"]["top1"] > 90, r.err


def test_eval_of_an_onnx_model_without_card_is_refused_too(cli: Cli, data_dir: Path, mobilenet: Path) -> None:
    r = cli("eval", str(mobilenet), "--data", str(data_dir / "imagenet-sample"), "--limit", "5")
    assert_one_line_error(r, 2, "mnv1.onnx has no model card")
    assert "then eval with --card mnv1.toml" in r.err
