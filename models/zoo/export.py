"""The two torch exporters as users call them: the legacy TorchScript one and dynamo (torch.export)."""

from __future__ import annotations

import warnings

EXPORTERS = ("legacy", "dynamo")


def export(module, args, path, exporter, input_names, output_names, dynamic_axes):
    """module(*args) into the ONNX file path. dynamic_axes: {input: {axis: dim name}}, as the legacy exporter takes
    them (dynamo gets torch.export Dims)."""
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, args, str(path), input_names=input_names, output_names=output_names,
                              dynamic_axes=dynamic_axes, opset_version=17, dynamo=False)
        elif exporter == "dynamo":
            dims = {}
            shapes = {name: {axis: dims.setdefault(dim, torch.export.Dim(dim, min=2)) for axis, dim in axes.items()}
                      for name, axes in dynamic_axes.items()}
            program = torch.onnx.export(module, args, input_names=input_names, output_names=output_names,
                                        dynamic_shapes=[shapes.get(n) for n in input_names], dynamo=True,
                                        optimize=True, verbose=False)
            program.save(str(path))
        else:
            raise ValueError(f"exporter {exporter!r}: one of {EXPORTERS}")
