"""Tuning databases are named by the model's graph without its weights (onnx_model.graph_digest)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgedeploy.compile.frontends.onnx_model import graph_digest, load_onnx
from edgedeploy.compile.tuning.apply import adopt_file_keyed_database, database_dir, user_root
from edgedeploy.compile.tuning.key import tuning_key


def _model(seed: int = 0, kernel: int = 3, shape: tuple[int, ...] = (1, 288), producer: str = "a") -> onnx.ModelProto:
    """conv -> relu -> reshape by an int64 shape constant; weights drawn from `seed`."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, kernel, kernel)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    s = numpy_helper.from_array(np.array(shape, dtype=np.int64), "shape")
    pad = (kernel - 3) // 2  # 6x6 out of 8x8 either way
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["c"], name=f"conv-{producer}", kernel_shape=[kernel] * 2, pads=[pad] * 4
        ),  # fmt: skip
        helper.make_node("Relu", ["c"], ["r"], name=f"relu-{producer}"),
        helper.make_node("Reshape", ["r", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [w, b, s],
        doc_string=f"exported by {producer}",
    )
    m = helper.make_model(graph, producer_name=producer, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    return m


def test_other_weights_names_or_producer_give_the_same_digest() -> None:
    assert graph_digest(_model(seed=0)) == graph_digest(_model(seed=1))  # retrained
    assert graph_digest(_model(producer="a")) == graph_digest(_model(producer="b"))  # node names, doc, producer


def test_another_graph_gives_another_digest() -> None:
    base = graph_digest(_model())
    assert graph_digest(_model(kernel=5)) != base  # another kernel shape: other kernels
    assert graph_digest(_model(shape=(8, 36))) != base  # a shape constant is part of the graph


def test_the_digest_does_not_depend_on_how_the_file_stores_its_tensors(tmp_path: Path) -> None:
    m = _model()
    typed = onnx.ModelProto()
    typed.CopyFrom(m)
    for t in typed.graph.initializer:  # the same values in the typed fields instead of raw_data
        arr = numpy_helper.to_array(t)
        t.ClearField("raw_data")
        (t.int64_data if arr.dtype == np.int64 else t.float_data).extend(arr.ravel().tolist())
    assert graph_digest(typed) == graph_digest(m)
    onnx.save(m, tmp_path / "m.onnx")
    loaded = load_onnx(tmp_path / "m.onnx")
    assert loaded.graph_sha256 == graph_digest(m) != loaded.sha256


def test_a_user_database_named_by_the_file_moves_to_the_graph_key(tmp_path: Path, hermetic: Path) -> None:
    onnx.save(_model(), tmp_path / "m.onnx")
    model = load_onnx(tmp_path / "m.onnx")
    old = database_dir("cpu-x86_64", f"{model.sha256[:16]}-fp32", user_root())
    old.mkdir(parents=True)
    (old / "database_tuning_record.json").write_text("{}\n")
    adopt_file_keyed_database("cpu-x86_64", model, "fp32")
    new = database_dir("cpu-x86_64", tuning_key(model, "fp32"), user_root())
    assert not old.exists() and (new / "database_tuning_record.json").read_text() == "{}\n"
    old.mkdir()  # both names: the graph's stays, the old one is left for the user
    adopt_file_keyed_database("cpu-x86_64", model, "fp32")
    assert old.is_dir() and (new / "database_tuning_record.json").is_file()
