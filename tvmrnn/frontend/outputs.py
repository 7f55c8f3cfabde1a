"""Model outputs that are a recurrent node's Y glued the way exporters glue it ([T, 1, N, H] -> [T, N, H]:
Squeeze(axes=[1]), or Transpose(perm=[0, 2, 1, 3]) + Reshape([0, 0, -1])), written by the node's kernel in that shape.

With one direction the glue moves no bytes, but TVM runs a function output's reshape as a copy kernel (it turns into
views only the reshapes of values that stay inside the function): a copy of Y at every run. So the node takes the
output's name for its Y, the glue's nodes go, and the layer's spec says so (RNNLayerSpec.y_squeezed): its kernels write
Y as [T, N, H], the same bytes they wrote as [T, 1, N, H].
"""

from __future__ import annotations

import onnx

from .stacks import RNN_OPS, _attr, _Graph

FOLD = True  # False: every glue stays (for A/B runs)


def fold_output_glue(model: onnx.ModelProto, skip: set[int]) -> tuple[onnx.ModelProto, set[int]]:
    """(the model with each foldable output's glue gone, the indexes among the graph's recurrent nodes of the nodes
    whose Y is now that output). A node folds where it has one direction and layout 0, its Y feeds the glue alone and
    is not itself an output, and it is not in `skip` (stacked layers, which run as one kernel of their own)."""
    if not FOLD:
        return model, set()
    graph = _Graph(model)
    consumers = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    rnn = {id(n): i for i, n in enumerate(n for n in model.graph.node if n.op_type in RNN_OPS)}
    folds, dropped = {}, set()  # node id -> the output its Y becomes; the glue's nodes
    for out in outputs:
        y = graph.glued_from(out)
        node = graph.producers.get(y) if y else None
        if node is None or id(node) not in rnn or rnn[id(node)] in skip or node.output[0] != y or y in outputs:
            continue
        if _attr(node, "direction", b"forward") == b"bidirectional" or _attr(node, "layout", 0) != 0:
            continue
        glue = [graph.producers[out]]
        if glue[0].op_type == "Reshape":
            glue.insert(0, graph.producers[glue[0].input[0]])
        if any(len(consumers.get(g.input[0], [])) != 1 for g in glue):  # Y (and the transposed Y) read by the glue alone
            continue
        folds[id(node)] = out
        dropped.update(id(g) for g in glue)
    if not folds:
        return model, set()
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    del folded.graph.node[:]
    gone = set()
    for node in model.graph.node:
        if id(node) in dropped:
            gone.update(node.output)
            continue
        copy = folded.graph.node.add()
        copy.CopyFrom(node)
        if id(node) in folds:
            gone.add(node.output[0])
            copy.output[0] = folds[id(node)]
    kept = [v for v in folded.graph.value_info if v.name not in gone]
    del folded.graph.value_info[:]
    folded.graph.value_info.extend(kept)
    return folded, {rnn[i] for i in folds}
